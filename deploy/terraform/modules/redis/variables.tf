variable "name" {
  description = "Name of the replication group and prefix of its other resources (lowercase letters, digits and hyphens)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,38}[a-z0-9]$", var.name))
    error_message = "name must be 2-40 characters of lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "vpc_id" {
  description = "VPC that holds the cache's security group."
  type        = string

  validation {
    condition     = can(regex("^vpc-", var.vpc_id))
    error_message = "vpc_id must be a VPC id (vpc-...)."
  }
}

variable "subnet_ids" {
  description = "Private subnets (one per availability zone) the cache nodes are placed in."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 2
    error_message = "subnet_ids needs at least two subnets so a replica can sit in another zone."
  }
}

variable "allowed_security_group_ids" {
  description = "Security groups (the EKS nodes') allowed to reach Redis on its port; nothing else is."
  type        = list(string)

  validation {
    condition     = length(var.allowed_security_group_ids) >= 1
    error_message = "allowed_security_group_ids needs at least one security group, or nothing could reach the cache."
  }
}

variable "node_type" {
  description = "ElastiCache node type."
  type        = string
  default     = "cache.r7g.large"

  validation {
    condition     = can(regex("^cache\\.", var.node_type))
    error_message = "node_type must be an ElastiCache node type (cache.*)."
  }
}

variable "engine" {
  description = "Cache engine: valkey or redis (both speak the Redis protocol Sluice's quota and idempotency stores use)."
  type        = string
  default     = "valkey"

  validation {
    condition     = contains(["valkey", "redis"], var.engine)
    error_message = "engine must be valkey or redis."
  }
}

variable "engine_version" {
  description = "Engine version (7.x or later, for transit_encryption_mode)."
  type        = string
  default     = "8.0"

  validation {
    condition     = can(regex("^[7-9]\\.", var.engine_version))
    error_message = "engine_version must be 7.x or later."
  }
}

variable "num_cache_clusters" {
  description = "Nodes in the group: one primary plus replicas. More than one turns on automatic failover and multi-AZ."
  type        = number
  default     = 2

  validation {
    condition     = var.num_cache_clusters >= 1 && var.num_cache_clusters <= 6
    error_message = "num_cache_clusters must be between 1 and 6."
  }
}

variable "snapshot_retention_days" {
  description = "Days automatic snapshots are kept (0 turns them off; quota counters are rebuilt from the ledger anyway)."
  type        = number
  default     = 7

  validation {
    condition     = var.snapshot_retention_days >= 0 && var.snapshot_retention_days <= 35
    error_message = "snapshot_retention_days must be between 0 and 35."
  }
}

variable "kms_key_deletion_window_days" {
  description = "Days a deleted KMS key (cache and auth-token secret encryption) waits before AWS destroys it."
  type        = number
  default     = 30

  validation {
    condition     = var.kms_key_deletion_window_days >= 7 && var.kms_key_deletion_window_days <= 30
    error_message = "kms_key_deletion_window_days must be between 7 and 30."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
