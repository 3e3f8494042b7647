variable "bucket_name" {
  description = "Name of the S3 bucket that holds the gateways' files (tenants' batch input and output; globally unique)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name)) && !can(regex("\\.\\.", var.bucket_name))
    error_message = "bucket_name must be 3-63 characters of lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix the gateways write under (the PREFIX of SLUICE_FILES_URL=s3://BUCKET/PREFIX); the gateway role is scoped to it."
  type        = string
  default     = "files"

  validation {
    # What sluice/files/s3.py parse_files_url accepts, without slashes at the ends, and never empty: the
    # gateway role's grant is <bucket>/<prefix>/*.
    condition     = can(regex("^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*$", var.prefix))
    error_message = "prefix must be '/'-separated parts of letters, digits, '_', '.', '=' and '-', with no slash at either end and no wildcard."
  }
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

variable "noncurrent_version_expiration_days" {
  description = "Days a deleted or overwritten file's old version is kept: the window to undo a bad delete, and how long deleted tenant content lingers."
  type        = number
  default     = 7

  validation {
    condition     = var.noncurrent_version_expiration_days >= 1 && var.noncurrent_version_expiration_days <= 30
    error_message = "noncurrent_version_expiration_days must be between 1 and 30 (deleted tenant content must not linger)."
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
