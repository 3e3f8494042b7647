variable "bucket_name" {
  description = "Name of the S3 bucket that holds model weights and built engines (globally unique)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name)) && !can(regex("\\.\\.", var.bucket_name))
    error_message = "bucket_name must be 3-63 characters of lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit."
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
  description = "Days an overwritten or deleted object version is kept before it expires (the window to roll an artifact back)."
  type        = number
  default     = 90

  validation {
    condition     = var.noncurrent_version_expiration_days >= 1
    error_message = "noncurrent_version_expiration_days must be at least 1."
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
