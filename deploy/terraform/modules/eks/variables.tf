variable "name" {
  description = "Cluster name (also the prefix of its roles, key and node groups)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,38}$", var.name))
    error_message = "name must be 2-39 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "vpc_id" {
  description = "VPC the cluster and its nodes run in."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets (one per zone, at least two zones) for the control-plane ENIs and every node group."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 2
    error_message = "EKS needs subnets in at least two availability zones."
  }
}

variable "kubernetes_version" {
  description = "Kubernetes minor version of the control plane and node groups, e.g. 1.32."
  type        = string
  default     = "1.32"

  validation {
    condition     = can(regex("^1\\.[0-9]{2}$", var.kubernetes_version))
    error_message = "kubernetes_version must look like 1.32."
  }
}

variable "endpoint_public_access" {
  description = "Also expose the API server endpoint publicly (private access is always on)."
  type        = bool
  default     = false
}

variable "public_access_cidrs" {
  description = "CIDRs allowed to reach the public API endpoint; required (and never 0.0.0.0/0) when endpoint_public_access is true."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.public_access_cidrs : can(cidrnetmask(c)) && c != "0.0.0.0/0"])
    error_message = "public_access_cidrs must be valid IPv4 CIDRs, and not 0.0.0.0/0."
  }

  validation {
    condition     = !var.endpoint_public_access || length(var.public_access_cidrs) > 0
    error_message = "endpoint_public_access needs at least one public_access_cidrs entry."
  }
}

variable "cluster_log_types" {
  description = "Control-plane log types sent to CloudWatch."
  type        = list(string)
  default     = ["api", "audit", "authenticator", "controllerManager", "scheduler"]

  validation {
    condition     = alltrue([for t in var.cluster_log_types : contains(["api", "audit", "authenticator", "controllerManager", "scheduler"], t)])
    error_message = "cluster_log_types may hold only api, audit, authenticator, controllerManager, scheduler."
  }
}

variable "cluster_log_retention_days" {
  description = "Retention of the control-plane log group, in days."
  type        = number
  default     = 90

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.cluster_log_retention_days)
    error_message = "cluster_log_retention_days must be a retention period CloudWatch Logs accepts."
  }
}

variable "kms_key_deletion_window_days" {
  description = "Waiting period before the secrets-encryption KMS key is deleted, in days."
  type        = number
  default     = 30

  validation {
    condition     = var.kms_key_deletion_window_days >= 7 && var.kms_key_deletion_window_days <= 30
    error_message = "kms_key_deletion_window_days must be between 7 and 30."
  }
}

variable "gpu_instance_types" {
  description = "Instance types of the GPU node group: p5.48xlarge (8x H100), p5e.48xlarge or p5en.48xlarge (8x H200)."
  type        = list(string)
  default     = ["p5.48xlarge"]

  validation {
    condition     = length(var.gpu_instance_types) > 0 && alltrue([for t in var.gpu_instance_types : contains(["p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"], t)])
    error_message = "gpu_instance_types must be H100/H200 types: p5.48xlarge, p5e.48xlarge, p5en.48xlarge."
  }
}

variable "gpu_capacity_type" {
  description = "ON_DEMAND or CAPACITY_BLOCK (EC2 Capacity Blocks for ML)."
  type        = string
  default     = "ON_DEMAND"

  validation {
    condition     = contains(["ON_DEMAND", "CAPACITY_BLOCK"], var.gpu_capacity_type)
    error_message = "gpu_capacity_type must be ON_DEMAND or CAPACITY_BLOCK."
  }
}

variable "gpu_min" {
  description = "Minimum number of GPU nodes."
  type        = number
  default     = 0

  validation {
    condition     = var.gpu_min >= 0
    error_message = "gpu_min must be >= 0."
  }
}

variable "gpu_max" {
  description = "Maximum number of GPU nodes (the cluster autoscaler's ceiling)."
  type        = number
  default     = 2

  validation {
    condition     = var.gpu_max >= 1 && var.gpu_max >= var.gpu_min
    error_message = "gpu_max must be >= 1 and >= gpu_min."
  }
}

variable "gpu_desired" {
  description = "GPU nodes at creation; afterwards the autoscaler owns it (ignored on later applies)."
  type        = number
  default     = 1

  validation {
    condition     = var.gpu_desired >= var.gpu_min && var.gpu_desired <= var.gpu_max
    error_message = "gpu_desired must lie within [gpu_min, gpu_max]."
  }
}

variable "gpu_disk_size_gib" {
  description = "Root volume of a GPU node, in GiB: holds container images and the engines pulled from the weights bucket."
  type        = number
  default     = 1000

  validation {
    condition     = var.gpu_disk_size_gib >= 100
    error_message = "gpu_disk_size_gib must be >= 100."
  }
}

variable "cpu_instance_types" {
  description = "Instance types of the CPU node group (gateways, control plane, engine-build orchestration)."
  type        = list(string)
  default     = ["m7i.2xlarge"]

  validation {
    condition     = length(var.cpu_instance_types) > 0
    error_message = "cpu_instance_types must not be empty."
  }
}

variable "cpu_min" {
  description = "Minimum number of CPU nodes (two or more spreads gateways over zones)."
  type        = number
  default     = 2

  validation {
    condition     = var.cpu_min >= 1
    error_message = "cpu_min must be >= 1: the gateways and control plane need somewhere to run."
  }
}

variable "cpu_max" {
  description = "Maximum number of CPU nodes."
  type        = number
  default     = 6

  validation {
    condition     = var.cpu_max >= var.cpu_min
    error_message = "cpu_max must be >= cpu_min."
  }
}

variable "cpu_desired" {
  description = "CPU nodes at creation; afterwards the autoscaler owns it (ignored on later applies)."
  type        = number
  default     = 2

  validation {
    condition     = var.cpu_desired >= var.cpu_min && var.cpu_desired <= var.cpu_max
    error_message = "cpu_desired must lie within [cpu_min, cpu_max]."
  }
}

variable "cpu_disk_size_gib" {
  description = "Root volume of a CPU node, in GiB."
  type        = number
  default     = 100

  validation {
    condition     = var.cpu_disk_size_gib >= 20
    error_message = "cpu_disk_size_gib must be >= 20."
  }
}

variable "oidc_thumbprints" {
  description = "Server-certificate thumbprints of the cluster's OIDC issuer. AWS now trusts the issuer's CA itself for EKS, but the API still takes a list; the default is the documented root-CA thumbprint of oidc.eks.<region>.amazonaws.com (the tls provider is not available offline)."
  type        = list(string)
  default     = ["9e99a48a9960b14926bb7f3b02e22da2b0ab7280"]

  validation {
    condition     = length(var.oidc_thumbprints) > 0 && alltrue([for t in var.oidc_thumbprints : can(regex("^[0-9a-f]{40}$", t))])
    error_message = "oidc_thumbprints must be 40-character lowercase hex SHA-1 thumbprints."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
