# The callers (modules/weights, modules/files) validate the names and windows their users give; the bounds
# here are the ones AWS or this module's promises need, so a new caller cannot weaken them.

variable "bucket_name" {
  description = "Name of the S3 bucket (globally unique); also names the key's alias and the access-log prefix."
  type        = string
}

variable "kms_key_description" {
  description = "Description of the bucket's KMS key: what the bucket holds, for whoever reads the key list."
  type        = string
}

variable "kms_key_deletion_window_days" {
  description = "Days a deleted KMS key waits before AWS destroys it (and with it every object encrypted under it)."
  type        = number
  default     = 30

  validation {
    condition     = var.kms_key_deletion_window_days >= 7 && var.kms_key_deletion_window_days <= 30
    error_message = "kms_key_deletion_window_days must be between 7 and 30."
  }
}

variable "lifecycle_rule_id" {
  description = "Id of the lifecycle rule (what the console and the API show for it)."
  type        = string
  default     = "expire-noncurrent-versions"
}

variable "noncurrent_version_expiration_days" {
  description = "Days an overwritten or deleted object version is kept before it expires."
  type        = number

  validation {
    condition     = var.noncurrent_version_expiration_days >= 1
    error_message = "noncurrent_version_expiration_days must be at least 1."
  }
}

variable "expire_object_delete_markers" {
  description = "Remove a delete marker once every version behind it has expired (an object deleted for good)."
  type        = bool
  default     = false
}

variable "abort_incomplete_multipart_upload_days" {
  description = "Days after which an incomplete multipart upload is aborted and its parts deleted."
  type        = number
  default     = 7

  validation {
    condition     = var.abort_incomplete_multipart_upload_days >= 1
    error_message = "abort_incomplete_multipart_upload_days must be at least 1."
  }
}

variable "access_log_bucket_name" {
  description = "Bucket that receives S3 server access logs for this bucket; null turns access logging off."
  type        = string
  default     = null
}

variable "force_destroy" {
  description = "Allow terraform destroy to delete a bucket that still holds objects. Leave false outside throwaway environments."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
