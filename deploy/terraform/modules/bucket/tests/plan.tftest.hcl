# Plans the module against a mocked AWS provider (no credentials, no network) and checks the security
# settings a platform team relies on, for the defaults and for the knobs the files module turns.

mock_provider "aws" {
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }
}

variables {
  bucket_name                        = "sluice-bucket-test"
  kms_key_description                = "Encrypts the test bucket"
  noncurrent_version_expiration_days = 90
  tags                               = { Project = "sluice" }
}

run "bucket_is_private_versioned_and_kms_encrypted" {
  command = plan

  assert {
    condition = alltrue([
      aws_s3_bucket_public_access_block.this.block_public_acls,
      aws_s3_bucket_public_access_block.this.block_public_policy,
      aws_s3_bucket_public_access_block.this.ignore_public_acls,
      aws_s3_bucket_public_access_block.this.restrict_public_buckets,
    ])
    error_message = "All four public access block settings must be true."
  }

  assert {
    condition     = one(aws_s3_bucket_ownership_controls.this.rule).object_ownership == "BucketOwnerEnforced"
    error_message = "ACLs must be disabled (BucketOwnerEnforced)."
  }

  assert {
    condition     = one(aws_s3_bucket_versioning.this.versioning_configuration).status == "Enabled"
    error_message = "Versioning must be enabled."
  }

  assert {
    condition     = one(one(aws_s3_bucket_server_side_encryption_configuration.this.rule).apply_server_side_encryption_by_default).sse_algorithm == "aws:kms"
    error_message = "Objects must be encrypted with SSE-KMS."
  }

  assert {
    condition     = aws_kms_key.this.enable_key_rotation && aws_kms_key.this.deletion_window_in_days == 30 && aws_kms_key.this.tags["Project"] == "sluice"
    error_message = "The customer key must rotate, keep the default 30-day deletion window and carry the tags."
  }

  assert {
    condition     = aws_kms_alias.this.name == "alias/sluice-bucket-test" && aws_kms_key.this.description == "Encrypts the test bucket"
    error_message = "The key is named after the bucket and described as given."
  }

  assert {
    condition     = aws_s3_bucket.this.bucket == "sluice-bucket-test" && !aws_s3_bucket.this.force_destroy && aws_s3_bucket.this.tags["Project"] == "sluice"
    error_message = "The bucket keeps its name and tags and refuses destroy while it holds objects."
  }

  assert {
    condition     = length(aws_s3_bucket_logging.this) == 0
    error_message = "Access logging is off when no log bucket is given."
  }

  assert {
    condition = (
      one(aws_s3_bucket_lifecycle_configuration.this.rule).id == "expire-noncurrent-versions"
      && one(aws_s3_bucket_lifecycle_configuration.this.rule).noncurrent_version_expiration[0].noncurrent_days == 90
      && length(one(aws_s3_bucket_lifecycle_configuration.this.rule).expiration) == 0
      && one(aws_s3_bucket_lifecycle_configuration.this.rule).abort_incomplete_multipart_upload[0].days_after_initiation == 7
    )
    error_message = "By default old versions expire after the given days, delete markers stay, uploads abort after 7 days."
  }
}

run "lifecycle_knobs_and_access_logging" {
  command = plan

  variables {
    lifecycle_rule_id                      = "expire-deleted-files"
    noncurrent_version_expiration_days     = 7
    expire_object_delete_markers           = true
    abort_incomplete_multipart_upload_days = 1
    access_log_bucket_name                 = "sluice-access-logs"
  }

  assert {
    condition = (
      one(aws_s3_bucket_lifecycle_configuration.this.rule).id == "expire-deleted-files"
      && one(aws_s3_bucket_lifecycle_configuration.this.rule).noncurrent_version_expiration[0].noncurrent_days == 7
      && one(aws_s3_bucket_lifecycle_configuration.this.rule).expiration[0].expired_object_delete_marker
      && one(aws_s3_bucket_lifecycle_configuration.this.rule).abort_incomplete_multipart_upload[0].days_after_initiation == 1
    )
    error_message = "The lifecycle rule follows the knobs."
  }

  assert {
    condition     = aws_s3_bucket_logging.this[0].target_bucket == "sluice-access-logs" && aws_s3_bucket_logging.this[0].target_prefix == "s3/sluice-bucket-test/"
    error_message = "Access logs must go to the given bucket under the bucket's own prefix."
  }
}

run "bad_windows_are_refused" {
  command = plan

  variables {
    kms_key_deletion_window_days           = 3
    noncurrent_version_expiration_days     = 0
    abort_incomplete_multipart_upload_days = 0
  }

  expect_failures = [var.kms_key_deletion_window_days, var.noncurrent_version_expiration_days, var.abort_incomplete_multipart_upload_days]
}
