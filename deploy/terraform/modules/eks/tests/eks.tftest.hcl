# Plan-only checks against a mocked AWS provider: no credentials, no API calls.
mock_provider "aws" {
  # The mock's random strings are not JSON; a policy attribute must be.
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }
  mock_data "aws_partition" {
    defaults = {
      partition = "aws"
    }
  }
}

variables {
  name       = "sluice-test"
  vpc_id     = "vpc-0123456789abcdef0"
  subnet_ids = ["subnet-a", "subnet-b", "subnet-c"]
}

run "gpu_nodes_only_for_replicas" {
  command = plan

  assert {
    condition     = aws_eks_node_group.gpu.ami_type == "AL2023_x86_64_NVIDIA"
    error_message = "GPU nodes must run the NVIDIA AL2023 AMI"
  }

  assert {
    condition = anytrue([for t in aws_eks_node_group.gpu.taint :
    t.key == "nvidia.com/gpu" && t.value == "true" && t.effect == "NO_SCHEDULE"])
    error_message = "GPU nodes must carry the nvidia.com/gpu=true:NoSchedule taint"
  }

  assert {
    condition     = aws_eks_node_group.gpu.labels["sluice.io/role"] == "replica"
    error_message = "GPU nodes must be labelled sluice.io/role=replica"
  }

  assert {
    condition     = tolist(aws_eks_node_group.gpu.instance_types) == tolist(["p5.48xlarge"])
    error_message = "GPU default is p5.48xlarge (H100)"
  }

  assert {
    condition     = aws_eks_node_group.cpu.ami_type == "AL2023_x86_64_STANDARD" && length(aws_eks_node_group.cpu.taint) == 0
    error_message = "CPU nodes run the standard AMI, untainted"
  }
}

run "control_plane_private_encrypted_logged" {
  command = plan

  assert {
    condition     = aws_eks_cluster.this.vpc_config[0].endpoint_private_access && !aws_eks_cluster.this.vpc_config[0].endpoint_public_access
    error_message = "API endpoint must be private by default"
  }

  assert {
    condition     = aws_eks_cluster.this.encryption_config[0].resources == toset(["secrets"])
    error_message = "Kubernetes secrets must be envelope-encrypted"
  }

  assert {
    condition     = aws_kms_key.secrets.enable_key_rotation
    error_message = "the secrets key must rotate"
  }

  assert {
    condition     = contains(aws_eks_cluster.this.enabled_cluster_log_types, "audit") && length(aws_eks_cluster.this.enabled_cluster_log_types) == 5
    error_message = "every control-plane log type must be on by default"
  }

  assert {
    condition     = alltrue([for lt in aws_launch_template.node : lt.metadata_options[0].http_tokens == "required" && lt.metadata_options[0].http_put_response_hop_limit == 1])
    error_message = "nodes must require IMDSv2 with hop limit 1 (pods use IRSA, not the node role)"
  }

  assert {
    condition     = alltrue([for lt in aws_launch_template.node : lt.block_device_mappings[0].ebs[0].encrypted == "true"])
    error_message = "node root volumes must be encrypted"
  }

  assert {
    condition     = aws_iam_openid_connect_provider.this.client_id_list == toset(["sts.amazonaws.com"])
    error_message = "the OIDC provider's audience must be STS"
  }

  assert {
    condition     = aws_eks_addon.vpc_cni.addon_name == "vpc-cni" && jsondecode(aws_eks_addon.vpc_cni.configuration_values).enableNetworkPolicy == "true"
    error_message = "the VPC CNI must enforce NetworkPolicies (its network policy agent on)"
  }
}

run "h200_and_public_endpoint_from_a_cidr" {
  command = plan

  variables {
    gpu_instance_types     = ["p5e.48xlarge", "p5en.48xlarge"]
    endpoint_public_access = true
    public_access_cidrs    = ["203.0.113.0/24"]
  }

  assert {
    condition     = aws_eks_cluster.this.vpc_config[0].public_access_cidrs == toset(["203.0.113.0/24"])
    error_message = "public endpoint must be limited to the given CIDRs"
  }
}

# NOTE: one run for every rejection: each run starts the provider again, and expect_failures passes only
# when exactly the listed variables fail.
run "rejects_bad_inputs" {
  command = plan

  variables {
    gpu_instance_types     = ["g5.xlarge"]
    endpoint_public_access = true
    public_access_cidrs    = ["0.0.0.0/0"]
    gpu_max                = 2
    gpu_desired            = 3
  }

  expect_failures = [var.gpu_instance_types, var.public_access_cidrs, var.gpu_desired]
}
