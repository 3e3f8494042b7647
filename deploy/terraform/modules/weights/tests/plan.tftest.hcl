# Plans the module against a mocked AWS provider (no credentials, no network) and checks the security
# settings a platform team relies on.

mock_provider "aws" {
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }
}

variables {
  bucket_name = "sluice-weights-test"
  tags        = { Project = "sluice" }
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
    condition     = aws_kms_key.this.enable_key_rotation && aws_kms_key.this.deletion_window_in_days == 30
    error_message = "The customer key must rotate and keep the default 30-day deletion window."
  }

  assert {
    condition     = one(aws_s3_bucket_lifecycle_configuration.this.rule).noncurrent_version_expiration[0].noncurrent_days == 90
    error_message = "Noncurrent versions must expire after the configured days."
  }

  assert {
    condition     = length(aws_s3_bucket_logging.this) == 0
    error_message = "Access logging is off when no log bucket is given."
  }

  assert {
    condition     = aws_s3_bucket.this.bucket == "sluice-weights-test" && !aws_s3_bucket.this.force_destroy
    error_message = "The bucket keeps its name and refuses destroy while it holds objects."
  }
}

run "access_logging_when_a_log_bucket_is_given" {
  command = plan

  variables {
    access_log_bucket_name = "sluice-access-logs"
  }

  assert {
    condition     = aws_s3_bucket_logging.this[0].target_bucket == "sluice-access-logs"
    error_message = "Access logs must go to the given bucket."
  }
}

run "bad_bucket_name_is_refused" {
  command = plan

  variables {
    bucket_name = "Sluice_Weights"
  }

  expect_failures = [var.bucket_name]
}

run "short_kms_deletion_window_is_refused" {
  command = plan

  variables {
    kms_key_deletion_window_days = 3
  }

  expect_failures = [var.kms_key_deletion_window_days]
}
