output "bucket_name" {
  description = "Name of the files bucket."
  value       = module.bucket.bucket_name
}

output "bucket_arn" {
  description = "ARN of the files bucket (for the gateway role: read, write and delete under <arn>/<prefix>/*)."
  value       = module.bucket.bucket_arn
}

output "kms_key_arn" {
  description = "ARN of the customer-managed KMS key that encrypts the bucket; the gateway needs kms:Decrypt and kms:GenerateDataKey on it."
  value       = module.bucket.kms_key_arn
}

output "prefix" {
  description = "Key prefix the gateways keep their files under (no slashes at its ends)."
  value       = var.prefix
}

output "files_url" {
  description = "What every gateway's SLUICE_FILES_URL must be: s3://<bucket>/<prefix>."
  value       = "s3://${module.bucket.bucket_name}/${var.prefix}"
}
