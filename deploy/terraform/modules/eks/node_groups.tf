# Two managed node groups on the private subnets:
# - gpu: H100/H200 nodes with the NVIDIA AL2023 AMI (driver and container toolkit baked in), tainted
#   nvidia.com/gpu=true:NoSchedule so only Triton replicas (which tolerate it) land there;
# - cpu: gateways, the control plane and engine-build orchestration on the standard AL2023 AMI.
# Both use launch templates for IMDSv2 (hop limit 1 keeps pods off the node role's credentials, so
# they must use IRSA), encrypted gp3 root volumes and the node security group.

data "aws_iam_policy_document" "node_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = "${var.name}-node"
  assume_role_policy = data.aws_iam_policy_document.node_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "node" {
  for_each = toset([
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
  ])

  role       = aws_iam_role.node.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/${each.value}"
}

resource "aws_security_group" "node" {
  name        = "${var.name}-node"
  description = "EKS nodes of ${var.name}; data stores admit this group"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-node" })
}

resource "aws_vpc_security_group_ingress_rule" "node_from_node" {
  security_group_id            = aws_security_group.node.id
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "-1"
  description                  = "Node to node (pods, CoreDNS, NCCL between GPU nodes)"
}

resource "aws_vpc_security_group_egress_rule" "node_all" {
  security_group_id = aws_security_group.node.id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
  description       = "Egress through NAT (ECR, S3, STS, NGC)"
}

locals {
  node_groups = {
    gpu = {
      instance_types = var.gpu_instance_types
      ami_type       = "AL2023_x86_64_NVIDIA"
      capacity_type  = var.gpu_capacity_type
      min            = var.gpu_min
      max            = var.gpu_max
      desired        = var.gpu_desired
      disk_size_gib  = var.gpu_disk_size_gib
      role           = "replica"
    }
    cpu = {
      instance_types = var.cpu_instance_types
      ami_type       = "AL2023_x86_64_STANDARD"
      capacity_type  = "ON_DEMAND"
      min            = var.cpu_min
      max            = var.cpu_max
      desired        = var.cpu_desired
      disk_size_gib  = var.cpu_disk_size_gib
      role           = "system"
    }
  }
}

resource "aws_launch_template" "node" {
  for_each = local.node_groups

  name_prefix            = "${var.name}-${each.key}-"
  update_default_version = true
  vpc_security_group_ids = [aws_eks_cluster.this.vpc_config[0].cluster_security_group_id, aws_security_group.node.id]

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = each.value.disk_size_gib
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, { Name = "${var.name}-${each.key}" })
  }

  tags = var.tags
}

resource "aws_eks_node_group" "gpu" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "${var.name}-gpu"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.subnet_ids
  version         = var.kubernetes_version

  instance_types = local.node_groups.gpu.instance_types
  ami_type       = local.node_groups.gpu.ami_type
  capacity_type  = local.node_groups.gpu.capacity_type

  scaling_config {
    min_size     = local.node_groups.gpu.min
    max_size     = local.node_groups.gpu.max
    desired_size = local.node_groups.gpu.desired
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.node["gpu"].id
    version = aws_launch_template.node["gpu"].latest_version
  }

  labels = {
    "sluice.io/role" = local.node_groups.gpu.role
  }

  taint {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }

  tags = var.tags

  # NOTE: the cluster autoscaler moves desired_size; an apply must not drag it back.
  lifecycle {
    ignore_changes = [scaling_config[0].desired_size]
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_eks_node_group" "cpu" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "${var.name}-cpu"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.subnet_ids
  version         = var.kubernetes_version

  instance_types = local.node_groups.cpu.instance_types
  ami_type       = local.node_groups.cpu.ami_type
  capacity_type  = local.node_groups.cpu.capacity_type

  scaling_config {
    min_size     = local.node_groups.cpu.min
    max_size     = local.node_groups.cpu.max
    desired_size = local.node_groups.cpu.desired
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.node["cpu"].id
    version = aws_launch_template.node["cpu"].latest_version
  }

  labels = {
    "sluice.io/role" = local.node_groups.cpu.role
  }

  tags = var.tags

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size]
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}
