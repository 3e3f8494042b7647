output "bucket_name" {
  description = "Name of the bucket (known at plan time, unlike its id)."
  value       = aws_s3_bucket.this.bucket
}

output "bucket_arn" {
  description = "ARN of the bucket."
  value       = aws_s3_bucket.this.arn
}

output "kms_key_arn" {
  description = "ARN of the customer-managed KMS key that encrypts the bucket."
  value       = aws_kms_key.this.arn
}

output "lifecycle_rule" {
  description = "The bucket's lifecycle rule as planned (id, version expiry, delete markers, aborted uploads): what a caller chose, for its plan tests."
  value       = one(aws_s3_bucket_lifecycle_configuration.this.rule)
}
