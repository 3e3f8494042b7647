output "primary_endpoint" {
  description = "Host name of the primary node (connect with rediss://, TLS is required)."
  value       = aws_elasticache_replication_group.this.primary_endpoint_address
}

output "port" {
  description = "Port the cache listens on."
  value       = local.port
}

output "auth_token_secret_arn" {
  description = "ARN of the Secrets Manager secret whose string is the AUTH token."
  value       = aws_secretsmanager_secret.auth_token.arn
}

output "security_group_id" {
  description = "Security group of the cache nodes."
  value       = aws_security_group.this.id
}
