# The dev root planned end to end against a mocked AWS provider: every module wired, sizes as intended.
mock_provider "aws" {
  mock_data "aws_caller_identity" {
    defaults = {
      account_id = "123456789012"
    }
  }
  mock_data "aws_partition" {
    defaults = {
      partition = "aws"
    }
  }
  # The mock's generated strings are 8 characters, shorter than ElastiCache accepts for a token.
  mock_data "aws_secretsmanager_random_password" {
    defaults = {
      random_password = "mockmockmockmockmockmockmockmockmockmockmockmockmockmockmockmock"
    }
  }
  # The mock's random strings are not JSON; a policy attribute must be.
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }
}

run "dev_plan" {
  command = plan

  assert {
    condition     = length(module.network.private_subnet_ids) == 3 && length(module.network.public_subnet_ids) == 3
    error_message = "three private and three public subnets"
  }

  assert {
    condition     = length(module.network.nat_public_ips) == 1
    error_message = "dev shares one NAT gateway"
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
    condition = module.iam.service_account_subjects == {
      replica       = "system:serviceaccount:sluice:sluice-replica"
      build         = "system:serviceaccount:sluice:sluice-build"
      gateway       = "system:serviceaccount:sluice:sluice-gateway"
      control_plane = "system:serviceaccount:sluice:sluice-control-plane"
    }
    error_message = "IRSA subjects must match the ServiceAccounts in deploy/kubernetes/base"
  }

  assert {
    condition     = output.files_url == "s3://sluice-dev-files-123456789012/files"
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
