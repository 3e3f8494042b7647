# The root planned as dev, end to end against a mocked AWS provider: every module wired, sizes as intended.
# Run with dev's inputs (tests/deploy/test_terraform.py does):
#   terraform test -var-file=envs/dev.tfvars -filter=tests/dev.tftest.hcl
mock_provider "aws" {
  source = "./tests/mocks"
}

run "dev_plan" {
  command = plan

  assert {
    condition     = var.environment == "dev"
    error_message = "run this file with -var-file=envs/dev.tfvars"
  }

  assert {
    condition     = length(module.network.private_subnet_ids) == 3 && length(module.network.public_subnet_ids) == 3
    error_message = "three private and three public subnets"
  }

  assert {
    condition     = length(module.network.nat_public_ips) == 1
    error_message = "dev shares one NAT gateway"
  }

  assert {
    condition     = var.gpu_min == 0 && var.gpu_max == 1 && var.gpu_desired == 0
    error_message = "dev has at most one GPU node, and none when idle"
  }

  assert {
    condition     = !var.postgres_multi_az && var.redis_num_nodes == 1 && !var.protect_data
    error_message = "dev's datastores are single-node and destroyable"
  }

  assert {
    condition     = output.cluster_name == "sluice-dev"
    error_message = "cluster name is the environment name"
  }

  assert {
    condition     = toset(keys(output.role_arns)) == toset(["replica", "build", "gateway", "control_plane"])
    error_message = "one IRSA role per Sluice service account"
  }

  assert {
    condition     = output.files_url == "s3://sluice-dev-files-123456789012/files"
    error_message = "the gateways' files live under s3://<files bucket>/files"
  }
}

run "rejects_a_bad_environment_name" {
  command = plan

  variables {
    environment = "Dev_1"
  }

  expect_failures = [var.environment]
}
