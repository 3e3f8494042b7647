# The object store of the gateways' Files and Batch APIs (SLUICE_FILES_URL=s3://<bucket>/<prefix>): tenants'
# uploaded batch input and the batch output and error files. Tenant content, so a bucket of its own, apart
# from the weights: its own KMS key, and only the gateway role (modules/iam) may read, write or delete in it.
# The bucket itself comes from modules/bucket: private, ACLs disabled, TLS 1.2 or later only.
#
# Versioning is on, with a short window (noncurrent_version_expiration_days, 7 by default): a gateway bug or
# a leaked gateway credential that deletes or overwrites tenants' files can be undone for that long, and a
# file a tenant deletes is gone for good after it (its old version expires, then its delete marker).

module "bucket" {
  source = "../bucket"

  bucket_name                        = var.bucket_name
  kms_key_description                = "Encrypts the Sluice files bucket ${var.bucket_name} (tenants' batch input and output)"
  kms_key_deletion_window_days       = var.kms_key_deletion_window_days
  lifecycle_rule_id                  = "expire-deleted-and-overwritten-files"
  noncurrent_version_expiration_days = var.noncurrent_version_expiration_days
  # A file a tenant deletes is gone for good once its old version expires: its delete marker goes too.
  expire_object_delete_markers = true
  # Gateways write each file in one PUT; an upload left incomplete by another client costs storage.
  abort_incomplete_multipart_upload_days = 1
  access_log_bucket_name                 = var.access_log_bucket_name
  force_destroy                          = var.force_destroy
  tags                                   = var.tags
}
