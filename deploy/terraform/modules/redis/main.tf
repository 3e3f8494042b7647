# ElastiCache (Valkey or Redis) for Sluice's quotas and idempotency keys: TLS required in transit,
# encrypted at rest with this module's KMS key, an AUTH token kept in Secrets Manager, reachable only
# from the given security groups.

locals {
  port             = 6379
  is_replicated    = var.num_cache_clusters > 1
  auth_secret_name = "${var.name}/auth-token"
}

resource "aws_kms_key" "this" {
  description             = "Encrypts the Sluice cache ${var.name} and its auth token secret"
  deletion_window_in_days = var.kms_key_deletion_window_days
  enable_key_rotation     = true
  tags                    = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}

# NOTE: only hashicorp/aws is available (no random provider), so Secrets Manager makes the token. The data
# source draws a new value on every plan; both consumers ignore later draws, so the first one sticks.
# Rotating the token is a deliberate act: taint the secret version and the group together.
data "aws_secretsmanager_random_password" "auth_token" {
  password_length     = 64
  exclude_punctuation = true # ElastiCache refuses @, " and /; letters and digits are enough at 64 characters
}

resource "aws_secretsmanager_secret" "auth_token" {
  name                    = local.auth_secret_name
  description             = "AUTH token of the Sluice cache ${var.name}"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 7
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "auth_token" {
  secret_id     = aws_secretsmanager_secret.auth_token.id
  secret_string = data.aws_secretsmanager_random_password.auth_token.random_password

  lifecycle {
    ignore_changes = [secret_string]
  }
}

resource "aws_elasticache_subnet_group" "this" {
  name        = var.name
  description = "Private subnets of the Sluice cache ${var.name}"
  subnet_ids  = var.subnet_ids
  tags        = var.tags
}

resource "aws_security_group" "this" {
  name        = var.name
  description = "Sluice cache ${var.name}: Redis port from the allowed security groups only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = var.name })

  # NOTE: no egress rules: the provider removes AWS's default allow-all egress, and a cache starts no connections.
}

# NOTE: count, not for_each: the group ids usually come from resources not yet created, whose values are
# unknown at plan time, while the length of the list is known.
resource "aws_vpc_security_group_ingress_rule" "from_allowed" {
  count = length(var.allowed_security_group_ids)

  security_group_id            = aws_security_group.this.id
  description                  = "Redis over TLS from an allowed security group"
  ip_protocol                  = "tcp"
  from_port                    = local.port
  to_port                      = local.port
  referenced_security_group_id = var.allowed_security_group_ids[count.index]
  tags                         = var.tags
}

resource "aws_elasticache_replication_group" "this" {
  replication_group_id = var.name
  description          = "Sluice quotas and idempotency keys"
  engine               = var.engine
  engine_version       = var.engine_version
  node_type            = var.node_type
  num_cache_clusters   = var.num_cache_clusters
  port                 = local.port

  subnet_group_name  = aws_elasticache_subnet_group.this.name
  security_group_ids = [aws_security_group.this.id]

  automatic_failover_enabled = local.is_replicated
  multi_az_enabled           = local.is_replicated

  at_rest_encryption_enabled = true
  kms_key_id                 = aws_kms_key.this.arn
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = data.aws_secretsmanager_random_password.auth_token.random_password

  snapshot_retention_limit   = var.snapshot_retention_days
  auto_minor_version_upgrade = true
  apply_immediately          = false
  tags                       = var.tags

  lifecycle {
    ignore_changes = [auth_token]
  }
}
