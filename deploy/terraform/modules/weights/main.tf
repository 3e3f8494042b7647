# A versioned, KMS-encrypted S3 bucket for model weights and built engines, built by modules/bucket:
# private, ACLs disabled, TLS 1.2 or later only. Old versions are kept noncurrent_version_expiration_days
# (90 by default), the window to roll an artifact back.

module "bucket" {
  source = "../bucket"

  bucket_name                        = var.bucket_name
  kms_key_description                = "Encrypts the Sluice weights bucket ${var.bucket_name}"
  kms_key_deletion_window_days       = var.kms_key_deletion_window_days
  lifecycle_rule_id                  = "expire-noncurrent-versions"
  noncurrent_version_expiration_days = var.noncurrent_version_expiration_days
  # Builds upload multi-GB engines in parts; a build killed mid-upload leaves parts worth a week's retry.
  abort_incomplete_multipart_upload_days = 7
  access_log_bucket_name                 = var.access_log_bucket_name
  force_destroy                          = var.force_destroy
  tags                                   = var.tags
}

# NOTE: the resources lived in this module before modules/bucket; these keep a deployed bucket and key
# (moved, not destroyed and re-created) when an environment applies this version.
moved {
  from = aws_kms_key.this
  to   = module.bucket.aws_kms_key.this
}

moved {
  from = aws_kms_alias.this
  to   = module.bucket.aws_kms_alias.this
}

moved {
  from = aws_s3_bucket.this
  to   = module.bucket.aws_s3_bucket.this
}

moved {
  from = aws_s3_bucket_public_access_block.this
  to   = module.bucket.aws_s3_bucket_public_access_block.this
}

moved {
  from = aws_s3_bucket_ownership_controls.this
  to   = module.bucket.aws_s3_bucket_ownership_controls.this
}

moved {
  from = aws_s3_bucket_versioning.this
  to   = module.bucket.aws_s3_bucket_versioning.this
}

moved {
  from = aws_s3_bucket_server_side_encryption_configuration.this
  to   = module.bucket.aws_s3_bucket_server_side_encryption_configuration.this
}

moved {
  from = aws_s3_bucket_lifecycle_configuration.this
  to   = module.bucket.aws_s3_bucket_lifecycle_configuration.this
}

moved {
  from = aws_s3_bucket_logging.this
  to   = module.bucket.aws_s3_bucket_logging.this
}

moved {
  from = aws_s3_bucket_policy.this
  to   = module.bucket.aws_s3_bucket_policy.this
}
