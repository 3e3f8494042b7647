variable "region" {
  description = "AWS region of the environment."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must be an AWS region name such as us-east-1."
  }
}

variable "azs" {
  description = "Three availability zones of the region that offer the GPU instance types (p5 capacity is zonal)."
  type        = list(string)
  default     = ["us-east-1a", "us-east-1b", "us-east-1c"]

  validation {
    condition     = length(var.azs) == 3 && length(distinct(var.azs)) == 3
    error_message = "azs must list three distinct availability zones."
  }
}

variable "allowed_account_ids" {
  description = "AWS account IDs this root may be applied to (a guard against the wrong credentials); null allows any."
  type        = list(string)
  default     = null

  validation {
    condition     = var.allowed_account_ids == null || alltrue([for id in coalesce(var.allowed_account_ids, []) : can(regex("^[0-9]{12}$", id))])
    error_message = "allowed_account_ids must be 12-digit account IDs."
  }
}

variable "api_allowed_cidrs" {
  description = "CIDRs (office, VPN) that may reach the Kubernetes API's public endpoint; empty keeps the endpoint private-only."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.api_allowed_cidrs : can(cidrnetmask(c)) && c != "0.0.0.0/0"])
    error_message = "api_allowed_cidrs must be valid IPv4 CIDRs, and not 0.0.0.0/0."
  }
}

variable "weights_bucket_name" {
  description = "Name of the weights bucket; null derives <env name>-weights-<account id> (bucket names are global)."
  type        = string
  default     = null
}

variable "files_bucket_name" {
  description = "Name of the gateways' files bucket (Files and Batch APIs); null derives <env name>-files-<account id>."
  type        = string
  default     = null
}
