# RDS PostgreSQL for Sluice's usage ledger and model registry: private, encrypted with this module's KMS
# key, TLS forced, the master password generated and rotated by RDS in Secrets Manager.

locals {
  port          = 5432
  major_version = split(".", var.engine_version)[0]
}

data "aws_partition" "current" {}

resource "aws_kms_key" "this" {
  description             = "Encrypts the Sluice database ${var.name}: storage, Performance Insights and the master secret"
  deletion_window_in_days = var.kms_key_deletion_window_days
  enable_key_rotation     = true
  tags                    = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}

resource "aws_db_subnet_group" "this" {
  name        = var.name
  description = "Private subnets of the Sluice database ${var.name}"
  subnet_ids  = var.subnet_ids
  tags        = var.tags
}

resource "aws_security_group" "this" {
  name        = var.name
  description = "Sluice database ${var.name}: PostgreSQL port from the allowed security groups only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = var.name })

  # NOTE: no egress rules: the provider removes AWS's default allow-all egress, and the database starts no connections.
}

# NOTE: count, not for_each: the group ids usually come from resources not yet created (unknown at plan time).
resource "aws_vpc_security_group_ingress_rule" "from_allowed" {
  count = length(var.allowed_security_group_ids)

  security_group_id            = aws_security_group.this.id
  description                  = "PostgreSQL from an allowed security group"
  ip_protocol                  = "tcp"
  from_port                    = local.port
  to_port                      = local.port
  referenced_security_group_id = var.allowed_security_group_ids[count.index]
  tags                         = var.tags
}

resource "aws_db_parameter_group" "this" {
  name        = "${var.name}-pg${local.major_version}"
  family      = "postgres${local.major_version}"
  description = "Sluice database ${var.name}: TLS only, slow and DDL statements logged"
  tags        = var.tags

  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }

  parameter {
    name  = "log_min_duration_statement"
    value = "1000" # ms: ledger writes and registry reads take single milliseconds; a second is worth a log line
  }

  parameter {
    name  = "log_statement"
    value = "ddl"
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_iam_role" "monitoring" {
  count = var.monitoring_interval_s > 0 ? 1 : 0

  name = "${var.name}-monitoring"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "monitoring.rds.amazonaws.com" }
    }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "monitoring" {
  count = var.monitoring_interval_s > 0 ? 1 : 0

  role       = aws_iam_role.monitoring[0].name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

resource "aws_db_instance" "this" {
  identifier     = var.name
  engine         = "postgres"
  engine_version = var.engine_version
  instance_class = var.instance_class
  port           = local.port
  db_name        = var.database_name
  username       = var.master_username

  manage_master_user_password   = true
  master_user_secret_kms_key_id = aws_kms_key.this.arn

  allocated_storage     = var.allocated_storage_gib
  max_allocated_storage = max(var.max_allocated_storage_gib, var.allocated_storage_gib)
  storage_type          = "gp3"
  storage_encrypted     = true
  kms_key_id            = aws_kms_key.this.arn

  db_subnet_group_name   = aws_db_subnet_group.this.name
  vpc_security_group_ids = [aws_security_group.this.id]
  publicly_accessible    = false
  ca_cert_identifier     = "rds-ca-rsa2048-g1" # the 2021 CA, valid to 2061; clients verify against it
  multi_az               = var.multi_az
  parameter_group_name   = aws_db_parameter_group.this.name

  iam_database_authentication_enabled = var.iam_database_authentication_enabled

  backup_retention_period   = var.backup_retention_days
  backup_window             = "03:00-04:00"
  maintenance_window        = "sun:04:30-sun:05:30"
  copy_tags_to_snapshot     = true
  delete_automated_backups  = false
  deletion_protection       = var.deletion_protection
  skip_final_snapshot       = false
  final_snapshot_identifier = "${var.name}-final"

  auto_minor_version_upgrade  = true
  allow_major_version_upgrade = false
  apply_immediately           = false

  performance_insights_enabled          = true
  performance_insights_kms_key_id       = aws_kms_key.this.arn
  performance_insights_retention_period = 7
  monitoring_interval                   = var.monitoring_interval_s
  monitoring_role_arn                   = var.monitoring_interval_s > 0 ? aws_iam_role.monitoring[0].arn : null
  enabled_cloudwatch_logs_exports       = ["postgresql", "upgrade"]

  tags = var.tags

  depends_on = [aws_iam_role_policy_attachment.monitoring]
}
