# Plans the module against a mocked AWS provider (no credentials, no network) and checks what this module
# chooses: the short version window, delete-marker expiry, the URL the gateways are given, the inputs it
# refuses. modules/bucket's tests check the security settings it builds (private, TLS only, SSE-KMS).

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

# NOTE: the security settings (public access block, ownership, versioning, SSE-KMS, key rotation, TLS-only
# policy) are modules/bucket's and asserted in its own tests; these check what this module chooses.
run "deleted_files_expire_and_incomplete_uploads_are_aborted" {
  command = plan

  assert {
    condition     = module.bucket.lifecycle_rule.id == "expire-deleted-and-overwritten-files" && module.bucket.lifecycle_rule.noncurrent_version_expiration[0].noncurrent_days == 7
    error_message = "A deleted or overwritten file's old version expires after 7 days by default."
  }

  assert {
    condition     = module.bucket.lifecycle_rule.expiration[0].expired_object_delete_marker
    error_message = "Delete markers left with no versions behind them are removed."
  }

  assert {
    condition     = module.bucket.lifecycle_rule.abort_incomplete_multipart_upload[0].days_after_initiation == 1
    error_message = "Incomplete multipart uploads are aborted after a day."
  }
}

run "files_url_is_the_bucket_and_prefix" {
  command = plan

  assert {
    condition     = output.files_url == "s3://sluice-files-test/files" && output.prefix == "files" && output.bucket_name == "sluice-files-test"
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
