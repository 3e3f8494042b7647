# Plans the module against a mocked AWS provider (no credentials, no network) and checks the settings a
# platform team relies on: private, TLS only, KMS-encrypted, versioned with a short window, the URL the
# gateways are given.

mock_provider "aws" {
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }
}

variables {
  bucket_name = "sluice-files-test"
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
    error_message = "Versioning must be enabled (the window to undo a bad delete)."
  }

  assert {
    condition     = one(one(aws_s3_bucket_server_side_encryption_configuration.this.rule).apply_server_side_encryption_by_default).sse_algorithm == "aws:kms"
    error_message = "Objects must be encrypted with SSE-KMS."
  }

  assert {
    condition     = aws_kms_key.this.enable_key_rotation && aws_kms_key.this.tags["Project"] == "sluice"
    error_message = "The bucket's own key must rotate and carry the tags."
  }

  assert {
    condition     = aws_s3_bucket.this.bucket == "sluice-files-test" && !aws_s3_bucket.this.force_destroy && aws_s3_bucket.this.tags["Project"] == "sluice"
    error_message = "The bucket keeps its name and tags and refuses destroy while it holds objects."
  }

  assert {
    condition     = length(aws_s3_bucket_logging.this) == 0
    error_message = "Access logging is off when no log bucket is given."
  }
}

run "deleted_files_expire_and_incomplete_uploads_are_aborted" {
  command = plan

  assert {
    condition     = one(aws_s3_bucket_lifecycle_configuration.this.rule).noncurrent_version_expiration[0].noncurrent_days == 7
    error_message = "A deleted or overwritten file's old version expires after 7 days by default."
  }

  assert {
    condition     = one(aws_s3_bucket_lifecycle_configuration.this.rule).expiration[0].expired_object_delete_marker
    error_message = "Delete markers left with no versions behind them are removed."
  }

  assert {
    condition     = one(aws_s3_bucket_lifecycle_configuration.this.rule).abort_incomplete_multipart_upload[0].days_after_initiation == 1
    error_message = "Incomplete multipart uploads are aborted after a day."
  }
}

run "files_url_is_the_bucket_and_prefix" {
  command = plan

  assert {
    condition     = output.files_url == "s3://sluice-files-test/files" && output.prefix == "files"
    error_message = "files_url must be s3://<bucket>/files, what SLUICE_FILES_URL is set to."
  }
}

run "bad_inputs_are_refused" {
  command = plan

  variables {
    bucket_name                        = "Sluice_Files"
    prefix                             = "/files/*"
    noncurrent_version_expiration_days = 90
    kms_key_deletion_window_days       = 3
  }

  expect_failures = [var.bucket_name, var.prefix, var.noncurrent_version_expiration_days, var.kms_key_deletion_window_days]
}
