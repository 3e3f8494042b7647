output "endpoint" {
  description = "Host name of the database (without the port; see port). Connect with sslmode=verify-full."
  value       = aws_db_instance.this.address
}

output "port" {
  description = "Port the database listens on."
  value       = local.port
}

output "database_name" {
  description = "Name of the database created for Sluice."
  value       = aws_db_instance.this.db_name
}

output "master_user_secret_arn" {
  description = "ARN of the Secrets Manager secret, managed and rotated by RDS, holding the master user's credentials."
  value       = aws_db_instance.this.master_user_secret[0].secret_arn
}

output "security_group_id" {
  description = "Security group of the database."
  value       = aws_security_group.this.id
}
