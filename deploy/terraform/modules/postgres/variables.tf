variable "name" {
  description = "Identifier of the database instance and prefix of its other resources (lowercase letters, digits and hyphens)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,53}[a-z0-9]$", var.name)) && !can(regex("--", var.name))
    error_message = "name must be 2-55 characters of lowercase letters, digits and single hyphens, starting with a letter."
  }
}

variable "vpc_id" {
  description = "VPC that holds the database's security group."
  type        = string

  validation {
    condition     = can(regex("^vpc-", var.vpc_id))
    error_message = "vpc_id must be a VPC id (vpc-...)."
  }
}

variable "subnet_ids" {
  description = "Private subnets (in at least two availability zones) for the DB subnet group."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 2
    error_message = "subnet_ids needs at least two subnets (RDS requires two zones in a subnet group)."
  }
}

variable "allowed_security_group_ids" {
  description = "Security groups (the EKS nodes') allowed to reach PostgreSQL on its port; nothing else is."
  type        = list(string)

  validation {
    condition     = length(var.allowed_security_group_ids) >= 1
    error_message = "allowed_security_group_ids needs at least one security group, or nothing could reach the database."
  }
}

variable "instance_class" {
  description = "RDS instance class."
  type        = string
  default     = "db.r7g.large"

  validation {
    condition     = can(regex("^db\\.", var.instance_class))
    error_message = "instance_class must be an RDS instance class (db.*)."
  }
}

variable "engine_version" {
  description = "PostgreSQL version: a major (\"16\") lets RDS pick the latest minor; a major.minor pins it."
  type        = string
  default     = "16"

  validation {
    condition     = can(regex("^1[3-9](\\.[0-9]+)?$", var.engine_version))
    error_message = "engine_version must be PostgreSQL 13 or later, as MAJOR or MAJOR.MINOR."
  }
}

variable "database_name" {
  description = "Name of the database created for Sluice's ledger and registry."
  type        = string
  default     = "sluice"

  validation {
    condition     = can(regex("^[a-z][a-z0-9_]{0,62}$", var.database_name))
    error_message = "database_name must start with a letter and hold only lowercase letters, digits and underscores (63 at most)."
  }
}

variable "master_username" {
  description = "Master user name; its password is generated and rotated by RDS in Secrets Manager."
  type        = string
  default     = "sluice_admin"

  validation {
    condition     = can(regex("^[a-z][a-z0-9_]{0,62}$", var.master_username)) && var.master_username != "postgres"
    error_message = "master_username must start with a letter, hold only lowercase letters, digits and underscores, and not be the reserved name postgres."
  }
}

variable "allocated_storage_gib" {
  description = "Initial storage in GiB."
  type        = number
  default     = 100

  validation {
    condition     = var.allocated_storage_gib >= 20 && var.allocated_storage_gib <= 65536
    error_message = "allocated_storage_gib must be between 20 and 65536."
  }
}

variable "max_allocated_storage_gib" {
  description = "Ceiling for storage autoscaling in GiB (at least allocated_storage_gib)."
  type        = number
  default     = 500

  validation {
    condition     = var.max_allocated_storage_gib <= 65536
    error_message = "max_allocated_storage_gib must be at most 65536."
  }
}

variable "multi_az" {
  description = "Keep a synchronous standby in another zone."
  type        = bool
  default     = true
}

variable "deletion_protection" {
  description = "Refuse deletion of the instance; true in prod, false only in throwaway environments."
  type        = bool
  default     = true
}

variable "backup_retention_days" {
  description = "Days automated backups (point-in-time recovery) are kept."
  type        = number
  default     = 14

  validation {
    condition     = var.backup_retention_days >= 1 && var.backup_retention_days <= 35
    error_message = "backup_retention_days must be between 1 and 35 (0 would turn backups off)."
  }
}

variable "iam_database_authentication_enabled" {
  description = "Let IAM roles log in with short-lived tokens in addition to passwords."
  type        = bool
  default     = true
}

variable "monitoring_interval_s" {
  description = "Seconds between Enhanced Monitoring samples (0 turns it off)."
  type        = number
  default     = 60

  validation {
    condition     = contains([0, 1, 5, 10, 15, 30, 60], var.monitoring_interval_s)
    error_message = "monitoring_interval_s must be one of 0, 1, 5, 10, 15, 30, 60."
  }
}

variable "kms_key_deletion_window_days" {
  description = "Days a deleted KMS key (storage, Performance Insights and the master secret) waits before AWS destroys it."
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
