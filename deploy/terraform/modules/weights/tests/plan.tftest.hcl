# Plans the module against a mocked AWS provider (no credentials, no network) and checks what this module
# chooses (name, rollback window); modules/bucket's tests check the security settings it builds.

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

run "a_weights_bucket_with_a_90_day_rollback_window" {
  command = plan

  # NOTE: the security settings (public access block, ownership, versioning, SSE-KMS, key rotation, TLS-only
  # policy) are modules/bucket's and asserted in its own tests; these check what this module chooses.
  assert {
    condition     = output.bucket_name == "sluice-weights-test"
    error_message = "The bucket keeps its name."
  }

  assert {
    condition = (
      module.bucket.lifecycle_rule.id == "expire-noncurrent-versions"
      && module.bucket.lifecycle_rule.noncurrent_version_expiration[0].noncurrent_days == 90
      && length(module.bucket.lifecycle_rule.expiration) == 0
      && module.bucket.lifecycle_rule.abort_incomplete_multipart_upload[0].days_after_initiation == 7
    )
    error_message = "Noncurrent versions expire after 90 days by default, delete markers stay, uploads abort after 7 days."
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
