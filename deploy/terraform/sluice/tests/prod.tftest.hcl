# The root planned as prod, end to end against a mocked AWS provider: every module wired, sizes as intended.
# Run with prod's inputs (tests/deploy/test_terraform.py does):
#   terraform test -var-file=envs/prod.tfvars -filter=tests/prod.tftest.hcl
mock_provider "aws" {
  source = "./tests/mocks"
}

run "prod_plan" {
  command = plan

  assert {
    condition     = var.environment == "prod"
    error_message = "run this file with -var-file=envs/prod.tfvars"
  }

  assert {
    condition     = length(module.network.private_subnet_ids) == 3 && length(module.network.public_subnet_ids) == 3
    error_message = "three private and three public subnets"
  }

  assert {
    condition     = length(module.network.nat_public_ips) == 3
    error_message = "prod has a NAT gateway per zone"
  }

  assert {
    condition     = var.gpu_min == 2 && var.gpu_max == 16 && var.cpu_min == 3 && var.cpu_max == 12
    error_message = "prod keeps two GPU nodes up to sixteen, and three CPU nodes (one per zone) up to twelve"
  }

  assert {
    condition     = var.postgres_multi_az && var.redis_num_nodes >= 2 && var.enable_flow_logs
    error_message = "prod's datastores survive a zone (Multi-AZ PostgreSQL, Redis with a replica) and the VPC logs its flows"
  }

  assert {
    condition     = var.protect_data && var.kms_deletion_days == 30
    error_message = "prod's data is protected from deletion, and a deleted key waits the longest window"
  }

  assert {
    condition     = output.cluster_name == "sluice-prod"
    error_message = "cluster name is the environment name"
  }

  assert {
    condition     = toset(keys(output.role_arns)) == toset(["replica", "build", "gateway", "control_plane"])
    error_message = "one IRSA role per Sluice service account"
  }

  assert {
    condition = module.iam.service_account_subjects == {
      replica       = "system:serviceaccount:sluice:sluice-replica"
      build         = "system:serviceaccount:sluice:sluice-build"
      gateway       = "system:serviceaccount:sluice:sluice-gateway"
      control_plane = "system:serviceaccount:sluice:sluice-control-plane"
    }
    error_message = "IRSA subjects must match the ServiceAccounts in deploy/kubernetes/base"
  }

  assert {
    condition     = output.files_url == "s3://sluice-prod-files-123456789012/files"
    error_message = "the gateways' files live under s3://<files bucket>/files"
  }
}

# NOTE: the endpoint's public variant is planned in modules/eks/tests; each run here restarts the provider.
run "rejects_bad_inputs" {
  command = plan

  variables {
    api_allowed_cidrs   = ["0.0.0.0/0"]
    allowed_account_ids = ["123"]
  }

  expect_failures = [var.api_allowed_cidrs, var.allowed_account_ids]
}
