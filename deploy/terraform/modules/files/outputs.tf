output "bucket_name" {
  description = "Name of the files bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the files bucket (for the gateway role: read, write and delete under <arn>/<prefix>/*)."
  value       = aws_s3_bucket.this.arn
}

output "kms_key_arn" {
  description = "ARN of the customer-managed KMS key that encrypts the bucket; the gateway needs kms:Decrypt and kms:GenerateDataKey on it."
  value       = aws_kms_key.this.arn
}

output "prefix" {
  description = "Key prefix the gateways keep their files under (no slashes at its ends)."
  value       = var.prefix
}

output "files_url" {
  description = "What every gateway's SLUICE_FILES_URL must be: s3://<bucket>/<prefix>."
  value       = "s3://${aws_s3_bucket.this.bucket}/${var.prefix}"
}
