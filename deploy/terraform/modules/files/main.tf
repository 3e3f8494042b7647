# The object store of the gateways' Files and Batch APIs (SLUICE_FILES_URL=s3://<bucket>/<prefix>): tenants'
# uploaded batch input and the batch output and error files. Tenant content, so a bucket of its own, apart
# from the weights: its own KMS key, and only the gateway role (modules/iam) may read, write or delete in it.
# Nothing here is public: the public access block refuses public ACLs and policies, ACLs are disabled
# (BucketOwnerEnforced) and the bucket policy refuses any request not made over TLS 1.2 or later.
#
# Versioning is on, with a short window (noncurrent_version_expiration_days, 7 by default): a gateway bug or
# a leaked gateway credential that deletes or overwrites tenants' files can be undone for that long, and a
# file a tenant deletes is gone for good after it (its old version expires, then its delete marker).

resource "aws_kms_key" "this" {
  description             = "Encrypts the Sluice files bucket ${var.bucket_name} (tenants' batch input and output)"
  deletion_window_in_days = var.kms_key_deletion_window_days
  enable_key_rotation     = true
  tags                    = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.bucket_name}"
  target_key_id = aws_kms_key.this.key_id
}

resource "aws_s3_bucket" "this" {
  bucket        = var.bucket_name
  force_destroy = var.force_destroy
  tags          = var.tags
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket = aws_s3_bucket.this.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
    # NOTE: a bucket key cuts the KMS requests of many small files (one per batch part) and their cost.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  # NOTE: the rule needs versioning on first, or old versions would never exist to expire.
  depends_on = [aws_s3_bucket_versioning.this]

  rule {
    id     = "expire-deleted-and-overwritten-files"
    status = "Enabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_expiration_days
    }

    # A delete marker whose versions have all expired hides nothing: remove it too.
    expiration {
      expired_object_delete_marker = true
    }

    # Gateways write each file in one PUT; an upload left incomplete by another client costs storage.
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

resource "aws_s3_bucket_logging" "this" {
  count = var.access_log_bucket_name == null ? 0 : 1

  bucket        = aws_s3_bucket.this.id
  target_bucket = var.access_log_bucket_name
  target_prefix = "s3/${var.bucket_name}/"
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid       = "DenyOutdatedTLS"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.bucket.json

  # NOTE: with the public access block applied first, a policy that would make the bucket public is refused.
  depends_on = [aws_s3_bucket_public_access_block.this]
}
