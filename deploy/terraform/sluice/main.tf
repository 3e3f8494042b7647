# Sluice prod: a NAT gateway per zone, VPC flow logs, H200 GPU nodes from two up to sixteen, CPU nodes for
# gateways spread over three zones, Multi-AZ PostgreSQL and a two-node Redis with failover, data protected
# from deletion. Same modules and wiring as environments/dev; only the sizes in local.env differ.

locals {
  name = "sluice-prod"

  env = {
    cidr               = "10.0.0.0/16"
    single_nat_gateway = false
    enable_flow_logs   = true
    kubernetes_version = "1.32"
    gpu_instance_types = ["p5en.48xlarge", "p5e.48xlarge"]
    gpu_min            = 2
    gpu_max            = 16
    gpu_desired        = 2
    cpu_instance_types = ["m7i.2xlarge"]
    cpu_min            = 3
    cpu_max            = 12
    cpu_desired        = 3
    redis_node_type    = "cache.r7g.large"
    redis_num_nodes    = 2
    postgres_class     = "db.r7g.xlarge"
    postgres_multi_az  = true
    protect_data       = true
    kms_deletion_days  = 30
    namespace          = "sluice"
  }

  tags = {
    Project     = "sluice"
    Environment = "prod"
    ManagedBy   = "terraform"
  }
}

provider "aws" {
  region              = var.region
  allowed_account_ids = var.allowed_account_ids

  default_tags {
    tags = local.tags
  }
}

data "aws_caller_identity" "current" {}

module "network" {
  source = "../../modules/network"

  name               = local.name
  cidr               = local.env.cidr
  azs                = var.azs
  single_nat_gateway = local.env.single_nat_gateway
  enable_flow_logs   = local.env.enable_flow_logs
  cluster_name       = local.name
}

module "eks" {
  source = "../../modules/eks"

  name                         = local.name
  vpc_id                       = module.network.vpc_id
  subnet_ids                   = module.network.private_subnet_ids
  kubernetes_version           = local.env.kubernetes_version
  endpoint_public_access       = length(var.api_allowed_cidrs) > 0
  public_access_cidrs          = var.api_allowed_cidrs
  kms_key_deletion_window_days = local.env.kms_deletion_days
  gpu_instance_types           = local.env.gpu_instance_types
  gpu_min                      = local.env.gpu_min
  gpu_max                      = local.env.gpu_max
  gpu_desired                  = local.env.gpu_desired
  cpu_instance_types           = local.env.cpu_instance_types
  cpu_min                      = local.env.cpu_min
  cpu_max                      = local.env.cpu_max
  cpu_desired                  = local.env.cpu_desired
}

module "weights" {
  source = "../../modules/weights"

  bucket_name                  = coalesce(var.weights_bucket_name, "${local.name}-weights-${data.aws_caller_identity.current.account_id}")
  kms_key_deletion_window_days = local.env.kms_deletion_days
  force_destroy                = !local.env.protect_data
}

# Tenants' batch input and output (the gateways' SLUICE_FILES_URL): apart from the weights, its own key.
module "files" {
  source = "../../modules/files"

  bucket_name                  = coalesce(var.files_bucket_name, "${local.name}-files-${data.aws_caller_identity.current.account_id}")
  kms_key_deletion_window_days = local.env.kms_deletion_days
  force_destroy                = !local.env.protect_data
}

module "redis" {
  source = "../../modules/redis"

  name                         = "${local.name}-redis"
  vpc_id                       = module.network.vpc_id
  subnet_ids                   = module.network.private_subnet_ids
  allowed_security_group_ids   = [module.eks.node_security_group_id]
  node_type                    = local.env.redis_node_type
  num_cache_clusters           = local.env.redis_num_nodes
  kms_key_deletion_window_days = local.env.kms_deletion_days
}

module "postgres" {
  source = "../../modules/postgres"

  name                         = "${local.name}-postgres"
  vpc_id                       = module.network.vpc_id
  subnet_ids                   = module.network.private_subnet_ids
  allowed_security_group_ids   = [module.eks.node_security_group_id]
  instance_class               = local.env.postgres_class
  multi_az                     = local.env.postgres_multi_az
  deletion_protection          = local.env.protect_data
  kms_key_deletion_window_days = local.env.kms_deletion_days
}

module "iam" {
  source = "../../modules/iam"

  name                = local.name
  oidc_provider_arn   = module.eks.oidc_provider_arn
  oidc_provider_url   = module.eks.oidc_provider_url
  namespace           = local.env.namespace
  weights_bucket_arn  = module.weights.bucket_arn
  weights_kms_key_arn = module.weights.kms_key_arn
  files_bucket_arn    = module.files.bucket_arn
  files_kms_key_arn   = module.files.kms_key_arn
  files_prefix        = "${module.files.prefix}/"
}
