output "bucket_name" {
  description = "Name of the weights bucket."
  value       = module.bucket.bucket_name
}

output "bucket_arn" {
  description = "ARN of the weights bucket (for IAM policies: readers get <arn>/*, the build job writes there)."
  value       = module.bucket.bucket_arn
}

output "kms_key_arn" {
  description = "ARN of the customer-managed KMS key that encrypts the bucket; readers need kms:Decrypt on it, writers kms:GenerateDataKey too."
  value       = module.bucket.kms_key_arn
}
