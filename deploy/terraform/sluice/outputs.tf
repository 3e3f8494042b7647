output "region" {
  description = "AWS region of the environment."
  value       = var.region
}

output "vpc_id" {
  description = "VPC of the environment."
  value       = module.network.vpc_id
}

output "private_subnet_ids" {
  description = "Private subnets (nodes, Redis, PostgreSQL)."
  value       = module.network.private_subnet_ids
}

output "cluster_name" {
  description = "EKS cluster name: aws eks update-kubeconfig --name <this> --region <region>."
  value       = module.eks.cluster_name
}

output "cluster_endpoint" {
  description = "Kubernetes API server URL."
  value       = module.eks.cluster_endpoint
}

output "node_security_group_id" {
  description = "Security group of every node (admitted into Redis and PostgreSQL)."
  value       = module.eks.node_security_group_id
}

output "redis_endpoint" {
  description = "Redis primary endpoint host (TLS): SLUICE_REDIS_URL=rediss://:<token>@<this>:<port>/0."
  value       = module.redis.primary_endpoint
}

output "redis_port" {
  description = "Redis port."
  value       = module.redis.port
}

output "redis_auth_token_secret_arn" {
  description = "Secrets Manager secret holding the Redis auth token."
  value       = module.redis.auth_token_secret_arn
}

output "postgres_endpoint" {
  description = "PostgreSQL endpoint host (TLS required)."
  value       = module.postgres.endpoint
}

output "postgres_port" {
  description = "PostgreSQL port."
  value       = module.postgres.port
}

output "postgres_master_user_secret_arn" {
  description = "Secrets Manager secret (managed and rotated by RDS) with the master user's password."
  value       = module.postgres.master_user_secret_arn
}

output "weights_bucket" {
  description = "Weights and engines bucket: s3://<this>/engines/... is where builds write."
  value       = module.weights.bucket_name
}

output "weights_kms_key_arn" {
  description = "KMS key of the weights bucket."
  value       = module.weights.kms_key_arn
}

output "files_url" {
  description = "SLUICE_FILES_URL of every gateway (s3://<files bucket>/files): the overlay's sluice-config sets it."
  value       = module.files.files_url
}

output "files_kms_key_arn" {
  description = "KMS key of the files bucket."
  value       = module.files.kms_key_arn
}

output "role_arns" {
  description = "IRSA role ARN per service account (replica, build, gateway, control_plane): the ServiceAccounts' eks.amazonaws.com/role-arn annotations."
  value       = module.iam.role_arns
}
