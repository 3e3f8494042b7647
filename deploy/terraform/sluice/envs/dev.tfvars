# Sluice dev: one NAT gateway, at most one GPU node (zero when idle), a single-node Redis and single-AZ
# PostgreSQL that may be destroyed. Same root and wiring as prod (envs/prod.tfvars); only these values differ.
# Plan with: terraform plan -var-file=envs/dev.tfvars (after init with envs/dev.s3.tfbackend).

environment = "dev"

cidr               = "10.0.0.0/16"
single_nat_gateway = true
enable_flow_logs   = false
kubernetes_version = "1.32"

gpu_instance_types = ["p5.48xlarge"]
gpu_min            = 0
gpu_max            = 1
gpu_desired        = 0

cpu_instance_types = ["m7i.xlarge"]
cpu_min            = 1
cpu_max            = 3
cpu_desired        = 2

redis_node_type = "cache.t4g.medium"
redis_num_nodes = 1

postgres_class    = "db.t4g.medium"
postgres_multi_az = false

protect_data      = false
kms_deletion_days = 7
