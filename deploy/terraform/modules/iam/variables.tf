variable "name" {
  description = "Prefix of every role name (e.g. sluice-prod -> sluice-prod-replica)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,38}$", var.name))
    error_message = "name must be 2-39 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "oidc_provider_arn" {
  description = "ARN of the cluster's IAM OIDC provider (modules/eks output oidc_provider_arn)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/", var.oidc_provider_arn))
    error_message = "oidc_provider_arn must be an IAM OIDC provider ARN."
  }
}

variable "oidc_provider_url" {
  description = "Issuer of the cluster's service-account tokens, with or without https:// (modules/eks output oidc_provider_url)."
  type        = string

  validation {
    condition     = length(trimprefix(var.oidc_provider_url, "https://")) > 0 && !strcontains(trimprefix(var.oidc_provider_url, "https://"), "://")
    error_message = "oidc_provider_url must be a host/path such as oidc.eks.us-east-1.amazonaws.com/id/ABC."
  }
}

variable "namespace" {
  description = "Kubernetes namespace of every Sluice service account."
  type        = string
  default     = "sluice"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a Kubernetes DNS label."
  }
}

variable "weights_bucket_arn" {
  description = "ARN of the weights/engines bucket (modules/weights output bucket_arn)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9.-]{3,63}$", var.weights_bucket_arn))
    error_message = "weights_bucket_arn must be an S3 bucket ARN (arn:aws:s3:::name)."
  }
}

variable "weights_kms_key_arn" {
  description = "ARN of the KMS key that encrypts the bucket (modules/weights output kms_key_arn)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:", var.weights_kms_key_arn))
    error_message = "weights_kms_key_arn must be a KMS key ARN."
  }
}

variable "files_bucket_arn" {
  description = "ARN of the gateways' files bucket (modules/files output bucket_arn): the one bucket a gateway writes."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9.-]{3,63}$", var.files_bucket_arn))
    error_message = "files_bucket_arn must be an S3 bucket ARN (arn:aws:s3:::name)."
  }
}

variable "files_kms_key_arn" {
  description = "ARN of the KMS key that encrypts the files bucket (modules/files output kms_key_arn)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:", var.files_kms_key_arn))
    error_message = "files_kms_key_arn must be a KMS key ARN."
  }
}

variable "files_prefix" {
  description = "Key prefix of the gateways' files in that bucket, ending in / (SLUICE_FILES_URL=s3://BUCKET/files -> files/)."
  type        = string
  default     = "files/"

  validation {
    condition     = can(regex("^[A-Za-z0-9._=-]+(/[A-Za-z0-9._=-]+)*/$", var.files_prefix))
    error_message = "files_prefix must be a non-empty key prefix ending in / (no leading /, no wildcards)."
  }
}

variable "engines_prefix" {
  description = "Key prefix under which the build job may write (build_engines' default destination is s3://BUCKET/engines/MODEL/VERSION)."
  type        = string
  default     = "engines/"

  validation {
    condition     = can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/$", var.engines_prefix))
    error_message = "engines_prefix must be a non-empty key prefix ending in / (no leading /, no wildcards)."
  }
}

variable "service_accounts" {
  description = "Service-account name of each Sluice process, keyed by role: replica, build, gateway, control_plane."
  type        = map(string)
  default = {
    replica       = "sluice-replica"
    build         = "sluice-build"
    gateway       = "sluice-gateway"
    control_plane = "sluice-control-plane"
  }

  validation {
    condition     = toset(keys(var.service_accounts)) == toset(["replica", "build", "gateway", "control_plane"])
    error_message = "service_accounts must have exactly the keys replica, build, gateway, control_plane."
  }

  validation {
    condition     = alltrue([for sa in values(var.service_accounts) : can(regex("^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", sa))])
    error_message = "every service account name must be a Kubernetes object name."
  }
}

variable "tags" {
  description = "Tags added to every role."
  type        = map(string)
  default     = {}
}
