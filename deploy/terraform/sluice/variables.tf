# What an environment is: envs/<env>.tfvars sets every variable of this first part and none has a default, so
# a plan without -var-file=envs/<env>.tfvars stops at "No value for required variable" rather than build
# one environment with another's sizes.

variable "environment" {
  description = "Environment name: sluice-<environment> names the cluster, buckets and roles, and tags every resource (Environment)."
  type        = string

  validation {
    # NOTE: short enough that every derived name fits (the Redis group "sluice-<env>-redis": 40 characters).
    condition     = can(regex("^[a-z][a-z0-9]{1,15}$", var.environment))
    error_message = "environment must be 2-16 lower-case letters or digits, starting with a letter (dev, prod)."
  }
}

variable "cidr" {
  description = "VPC CIDR (/16 or larger); deploy/kubernetes/overlays/<env> admits it into the datastores."
  type        = string
}

variable "single_nat_gateway" {
  description = "One NAT gateway for the three zones (cheaper, one zone's failure cuts egress) instead of one per zone."
  type        = bool
}

variable "enable_flow_logs" {
  description = "VPC flow logs to CloudWatch Logs."
  type        = bool
}

variable "kubernetes_version" {
  description = "EKS version (major.minor); set per environment so an upgrade goes through dev first."
  type        = string
}

variable "gpu_instance_types" {
  description = "Instance types of the GPU node group (replicas), in order of preference."
  type        = list(string)
}

variable "gpu_min" {
  description = "GPU node group minimum size."
  type        = number
}

variable "gpu_max" {
  description = "GPU node group maximum size."
  type        = number
}

variable "gpu_desired" {
  description = "GPU node group size at creation (the autoscaler moves it afterwards)."
  type        = number
}

variable "cpu_instance_types" {
  description = "Instance types of the CPU node group (gateways, control plane, system pods)."
  type        = list(string)
}

variable "cpu_min" {
  description = "CPU node group minimum size."
  type        = number
}

variable "cpu_max" {
  description = "CPU node group maximum size."
  type        = number
}

variable "cpu_desired" {
  description = "CPU node group size at creation."
  type        = number
}

variable "redis_node_type" {
  description = "ElastiCache node type."
  type        = string
}

variable "redis_num_nodes" {
  description = "ElastiCache nodes (1: no replica; 2 or more: automatic failover across zones)."
  type        = number
}

variable "postgres_class" {
  description = "RDS instance class."
  type        = string
}

variable "postgres_multi_az" {
  description = "RDS Multi-AZ standby."
  type        = bool
}

variable "protect_data" {
  description = "Deletion protection on the database and buckets that refuse terraform destroy while they hold objects; false only where the data is throwaway."
  type        = bool
}

variable "kms_deletion_days" {
  description = "Waiting period (7-30 days) before a deleted KMS key, and the data it encrypts, is gone."
  type        = number
}

# Where and by whom: the same for every environment unless given (-var or the var file).

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
