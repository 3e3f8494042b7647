# Sluice prod: a NAT gateway per zone, VPC flow logs, H200 GPU nodes from two up to sixteen, CPU nodes for
# gateways spread over three zones, Multi-AZ PostgreSQL and a two-node Redis with failover, data protected
# from deletion. Same root and wiring as dev (envs/dev.tfvars); only these values differ.
# Plan with: terraform plan -var-file=envs/prod.tfvars (after init with envs/prod.s3.tfbackend).

environment = "prod"

cidr               = "10.0.0.0/16"
single_nat_gateway = false
enable_flow_logs   = true
kubernetes_version = "1.32"

gpu_instance_types = ["p5en.48xlarge", "p5e.48xlarge"]
gpu_min            = 2
gpu_max            = 16
gpu_desired        = 2

cpu_instance_types = ["m7i.2xlarge"]
cpu_min            = 3
cpu_max            = 12
cpu_desired        = 3

redis_node_type = "cache.r7g.large"
redis_num_nodes = 2

postgres_class    = "db.r7g.xlarge"
postgres_multi_az = true

protect_data      = true
kms_deletion_days = 30
