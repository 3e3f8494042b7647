variable "name" {
  description = "Name prefix for every resource (e.g. sluice-prod); also the Name tag."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,38}$", var.name))
    error_message = "name must be 2-39 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "cidr" {
  description = "IPv4 CIDR block of the VPC; split into three private /19s and three public /22s."
  type        = string
  default     = "10.0.0.0/16"

  validation {
    condition     = can(cidrnetmask(var.cidr)) && try(tonumber(split("/", var.cidr)[1]) <= 16, false)
    error_message = "cidr must be a valid IPv4 CIDR block of /16 or larger."
  }
}

variable "azs" {
  description = "Exactly three availability zones, one private and one public subnet in each."
  type        = list(string)

  validation {
    condition     = length(var.azs) == 3 && length(distinct(var.azs)) == 3
    error_message = "azs must list three distinct availability zones."
  }
}

variable "single_nat_gateway" {
  description = "One NAT gateway shared by all private subnets (cheaper, dev) instead of one per zone (prod: a zone outage does not cut the others' egress)."
  type        = bool
  default     = false
}

variable "enable_flow_logs" {
  description = "Send VPC flow logs (all traffic) to a CloudWatch log group."
  type        = bool
  default     = false
}

variable "flow_log_retention_days" {
  description = "Retention of the flow log group, in days (a value CloudWatch accepts)."
  type        = number
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.flow_log_retention_days)
    error_message = "flow_log_retention_days must be a retention period CloudWatch Logs accepts."
  }
}

variable "cluster_name" {
  description = "EKS cluster name the subnets are tagged for (kubernetes.io/cluster/<name>), so load balancers find them; null tags none."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
