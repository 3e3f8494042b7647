# Sluice on AWS: one root for every environment. The wiring is here; what differs between environments
# (sizes, protection) is in envs/<env>.tfvars and the state key in envs/<env>.s3.tfbackend, so dev and prod
# cannot drift apart in how the modules fit together (README.md: Applying a root).

locals {
  name = "sluice-${var.environment}"

  # NOTE: the namespace of deploy/kubernetes/base; the IRSA roles trust its service accounts only.
  namespace = "sluice"

  tags = {
    Project     = "sluice"
    Environment = var.environment
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
  source = "../modules/network"

  name               = local.name
  cidr               = var.cidr
  azs                = var.azs
  single_nat_gateway = var.single_nat_gateway
  enable_flow_logs   = var.enable_flow_logs
  cluster_name       = local.name
}

module "eks" {
  source = "../modules/eks"

  name                         = local.name
  vpc_id                       = module.network.vpc_id
  subnet_ids                   = module.network.private_subnet_ids
  kubernetes_version           = var.kubernetes_version
  endpoint_public_access       = length(var.api_allowed_cidrs) > 0
  public_access_cidrs          = var.api_allowed_cidrs
  kms_key_deletion_window_days = var.kms_deletion_days
  gpu_instance_types           = var.gpu_instance_types
  gpu_min                      = var.gpu_min
  gpu_max                      = var.gpu_max
  gpu_desired                  = var.gpu_desired
  cpu_instance_types           = var.cpu_instance_types
  cpu_min                      = var.cpu_min
  cpu_max                      = var.cpu_max
  cpu_desired                  = var.cpu_desired
}

module "weights" {
  source = "../modules/weights"

  bucket_name                  = coalesce(var.weights_bucket_name, "${local.name}-weights-${data.aws_caller_identity.current.account_id}")
  kms_key_deletion_window_days = var.kms_deletion_days
  force_destroy                = !var.protect_data
}

# Tenants' batch input and output (the gateways' SLUICE_FILES_URL): apart from the weights, its own key.
module "files" {
  source = "../modules/files"

  bucket_name                  = coalesce(var.files_bucket_name, "${local.name}-files-${data.aws_caller_identity.current.account_id}")
  kms_key_deletion_window_days = var.kms_deletion_days
  force_destroy                = !var.protect_data
}

module "redis" {
  source = "../modules/redis"

  name                         = "${local.name}-redis"
  vpc_id                       = module.network.vpc_id
  subnet_ids                   = module.network.private_subnet_ids
  allowed_security_group_ids   = [module.eks.node_security_group_id]
  node_type                    = var.redis_node_type
  num_cache_clusters           = var.redis_num_nodes
  kms_key_deletion_window_days = var.kms_deletion_days
}

module "postgres" {
  source = "../modules/postgres"

  name                         = "${local.name}-postgres"
  vpc_id                       = module.network.vpc_id
  subnet_ids                   = module.network.private_subnet_ids
  allowed_security_group_ids   = [module.eks.node_security_group_id]
  instance_class               = var.postgres_class
  multi_az                     = var.postgres_multi_az
  deletion_protection          = var.protect_data
  kms_key_deletion_window_days = var.kms_deletion_days
}

module "iam" {
  source = "../modules/iam"

  name                = local.name
  oidc_provider_arn   = module.eks.oidc_provider_arn
  oidc_provider_url   = module.eks.oidc_provider_url
  namespace           = local.namespace
  weights_bucket_arn  = module.weights.bucket_arn
  weights_kms_key_arn = module.weights.kms_key_arn
  files_bucket_arn    = module.files.bucket_arn
  files_kms_key_arn   = module.files.kms_key_arn
  files_prefix        = "${module.files.prefix}/"
}
