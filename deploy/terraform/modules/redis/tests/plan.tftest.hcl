# Plans the module against a mocked AWS provider (no credentials, no network) and checks encryption,
# authentication, failover and who may connect.

mock_provider "aws" {
  # NOTE: the mock's generated strings are 8 characters, shorter than ElastiCache accepts for a token.
  mock_data "aws_secretsmanager_random_password" {
    defaults = {
      random_password = "mockmockmockmockmockmockmockmockmockmockmockmockmockmockmockmock"
    }
  }
}

variables {
  name                       = "sluice-test"
  vpc_id                     = "vpc-0123456789abcdef0"
  subnet_ids                 = ["subnet-aaaa", "subnet-bbbb", "subnet-cccc"]
  allowed_security_group_ids = ["sg-nodes"]
  tags                       = { Project = "sluice" }
}

run "encrypted_authenticated_and_replicated" {
  command = plan

  assert {
    condition     = aws_elasticache_replication_group.this.transit_encryption_enabled && aws_elasticache_replication_group.this.transit_encryption_mode == "required"
    error_message = "TLS must be required in transit."
  }

  assert {
    condition     = aws_elasticache_replication_group.this.at_rest_encryption_enabled == "true"
    error_message = "Encryption at rest must be on."
  }

  assert {
    condition     = aws_elasticache_replication_group.this.auth_token != null && aws_secretsmanager_secret_version.auth_token.secret_string == aws_elasticache_replication_group.this.auth_token
    error_message = "The AUTH token must be set and be the one stored in Secrets Manager."
  }

  assert {
    condition     = aws_elasticache_replication_group.this.automatic_failover_enabled && aws_elasticache_replication_group.this.multi_az_enabled
    error_message = "Two nodes (the default) must fail over automatically across zones."
  }

  assert {
    condition     = aws_kms_key.this.enable_key_rotation
    error_message = "The cache's KMS key must rotate."
  }

  assert {
    condition     = aws_elasticache_subnet_group.this.subnet_ids == toset(var.subnet_ids)
    error_message = "The cache must live in the given (private) subnets."
  }

  assert {
    condition = (
      length(aws_vpc_security_group_ingress_rule.from_allowed) == 1 &&
      aws_vpc_security_group_ingress_rule.from_allowed[0].referenced_security_group_id == "sg-nodes" &&
      aws_vpc_security_group_ingress_rule.from_allowed[0].from_port == 6379 &&
      aws_vpc_security_group_ingress_rule.from_allowed[0].to_port == 6379 &&
      aws_vpc_security_group_ingress_rule.from_allowed[0].cidr_ipv4 == null
    )
    error_message = "Only the allowed security group may reach port 6379, and no CIDR."
  }

  assert {
    condition     = output.port == 6379
    error_message = "The module must report port 6379."
  }
}

run "single_node_has_no_failover" {
  command = plan

  variables {
    num_cache_clusters = 1
  }

  assert {
    condition     = !aws_elasticache_replication_group.this.automatic_failover_enabled && !aws_elasticache_replication_group.this.multi_az_enabled
    error_message = "A single node cannot fail over; the flags must be off."
  }
}

run "one_rule_per_allowed_group" {
  command = plan

  variables {
    allowed_security_group_ids = ["sg-gpu-nodes", "sg-cpu-nodes"]
  }

  assert {
    condition     = [for rule in aws_vpc_security_group_ingress_rule.from_allowed : rule.referenced_security_group_id] == ["sg-gpu-nodes", "sg-cpu-nodes"]
    error_message = "Each allowed group gets its own ingress rule."
  }
}

run "empty_allow_list_is_refused" {
  command = plan

  variables {
    allowed_security_group_ids = []
  }

  expect_failures = [var.allowed_security_group_ids]
}

run "unknown_engine_is_refused" {
  command = plan

  variables {
    engine = "memcached"
  }

  expect_failures = [var.engine]
}
