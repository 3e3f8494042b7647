"""The security rules of deploy/terraform (terraform_rules.py) on every .tf file of the tree: the real tree
must give no violation, and a bad snippet fed to each rule must give one naming its file and resource, so
every rule can fail."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("hcl2", reason="python-hcl2 is not installed (pip install -e '.[test]')")
from terraform_rules import (
    GPU_HINT,
    RULES,
    TfFile,
    blocks,
    load_tree,
    modules,
    parse,
    rule_gateway_writes_only_files,
    rule_iam_statements,
    statements,
)


@pytest.fixture(scope="module")
def tree() -> list[TfFile]:
    return load_tree()


@pytest.mark.parametrize("rule_name", sorted(RULES))
def test_the_tree_keeps_the_rule(tree: list[TfFile], rule_name: str) -> None:
    violations = RULES[rule_name](tree)
    assert not violations, "\n".join(violations)


def test_the_rules_have_something_to_check(tree: list[TfFile]) -> None:
    """Guards against rules passing on an empty or renamed tree."""

    def count(type_: str) -> int:
        return sum(1 for _ in blocks(tree, "resource", type_))

    for type_ in (
        "aws_s3_bucket",
        "aws_db_instance",
        "aws_elasticache_replication_group",
        "aws_eks_cluster",
        "aws_kms_key",
        "aws_iam_role_policy",
    ):
        assert count(type_) >= 1, f"no {type_} under deploy/terraform"
    gpu_groups = [
        n for _, n, b in blocks(tree, "resource", "aws_eks_node_group") if GPU_HINT.search(n + str(b))
    ]
    assert gpu_groups, "no GPU node group under deploy/terraform"
    web_identity = [s for s in statements(tree) if "sts:AssumeRoleWithWebIdentity" in s.actions]
    assert web_identity, "no IRSA trust policy found (modules/iam)"
    wired = {re.sub(r".*/", "", str(b["source"]).rstrip("/")) for _, _, b in modules(tree)}
    assert {"eks", "redis", "postgres", "files"} <= wired, f"the environments wire only {sorted(wired)}"
    gateway_writes = [s for s in statements(tree) if "gateway" in s.origin and "s3:PutObject" in s.actions]
    assert gateway_writes, "no gateway write to the files bucket found (modules/iam)"


# One bad snippet per rule: the rule must report it, naming the file and the resource.
BAD_SNIPPETS: dict[str, tuple[str, str]] = {
    "s3_buckets": (
        """
resource "aws_s3_bucket" "open" { bucket = "x" }
resource "aws_s3_bucket_public_access_block" "open" {
  bucket = aws_s3_bucket.open.id
  block_public_acls = true
  block_public_policy = false
  ignore_public_acls = true
  restrict_public_buckets = true
}
""",
        "aws_s3_bucket.open: needs a public access block",
    ),
    "redis": (
        """
resource "aws_elasticache_replication_group" "plain" {
  description = "x"
  replication_group_id = "x"
  at_rest_encryption_enabled = true
  kms_key_id = "k"
  auth_token = "t"
}
""",
        "aws_elasticache_replication_group.plain: needs transit_encryption_enabled",
    ),
    "postgres": (
        """
resource "aws_db_instance" "db" {
  instance_class = "db.t3.micro"
  storage_encrypted = true
  kms_key_id = "k"
  publicly_accessible = true
  manage_master_user_password = true
}
""",
        "aws_db_instance.db: needs publicly_accessible = false",
    ),
    "eks": (
        """
resource "aws_eks_cluster" "c" {
  name = "c"
  role_arn = "r"
  vpc_config { subnet_ids = [] }
}
""",
        "aws_eks_cluster.c: needs encryption_config",
    ),
    "private_wiring": (
        """
module "eks" {
  source = "../../modules/eks"
  subnet_ids = module.network.public_subnet_ids
}
""",
        "module.eks: subnet_ids must be the private subnets",
    ),
    "no_open_ingress": (
        """
resource "aws_vpc_security_group_ingress_rule" "redis" {
  security_group_id = "sg"
  ip_protocol = "tcp"
  cidr_ipv4 = "0.0.0.0/0"
}
""",
        "aws_vpc_security_group_ingress_rule.redis: ingress open",
    ),
    "kms_rotation": (
        """
resource "aws_kms_key" "k" { description = "x" }
""",
        "aws_kms_key.k: needs enable_key_rotation",
    ),
    "gpu_taint": (
        """
resource "aws_eks_node_group" "gpu" {
  cluster_name = "c"
  ami_type = "AL2023_x86_64_NVIDIA"
  taint {
    key = "dedicated"
    value = "gpu"
    effect = "NO_SCHEDULE"
  }
}
""",
        "aws_eks_node_group.gpu: GPU nodes need the nvidia.com/gpu",
    ),
    "iam_statements": (
        """
locals {
  trust = {
    Statement = [{
      Effect = "Allow"
      Action = "sts:AssumeRoleWithWebIdentity"
      Condition = { StringLike = { "${local.issuer}:sub" = "system:serviceaccount:sluice:*" } }
    }]
  }
}
resource "aws_iam_role_policy" "replica" {
  role = aws_iam_role.this["replica"].id
  policy = jsonencode({ Statement = [{ Effect = "Allow", Action = ["s3:GetObject"], Resource = "*" }] })
}
""",
        "web-identity trust must name exactly one service account",
    ),
    "iam_attachments": (
        """
resource "aws_iam_role_policy" "cp" {
  role = aws_iam_role.this["control_plane"].id
  policy = "{}"
}
""",
        "aws_iam_role_policy.cp: the control plane gets no policy",
    ),
    "gateway_reads_tokenizers_only": (
        """
locals {
  gateway_files = ["tokenizer.json", "model.safetensors"]
  gateway_policy = {
    Statement = [{ Effect = "Allow", Action = "s3:GetObject", Resource = "${var.bucket_arn}/engines/*" }]
  }
}
""",
        "a gateway reads only manifests and tokenizers",
    ),
    "gateway_writes_only_files": (
        """
resource "aws_iam_role_policy" "gateway" {
  role = aws_iam_role.this["gateway"].id
  policy = jsonencode({ Statement = [
    { Effect = "Allow", Action = ["s3:PutObject"], Resource = "${var.weights_bucket_arn}/*" },
  ] })
}
""",
        "a gateway writes only the files bucket, got ['s3:PutObject'] on ${var.weights_bucket_arn}/*",
    ),
}


@pytest.mark.parametrize("rule_name", sorted(RULES))
def test_the_rule_catches_a_bad_snippet(rule_name: str) -> None:
    text, expected = BAD_SNIPPETS[rule_name]
    violations = RULES[rule_name]([parse("deploy/terraform/bad/main.tf", text)])
    assert any(v.startswith("deploy/terraform/bad/main.tf") and expected in v for v in violations), violations


def test_iam_statement_rule_sees_inside_jsonencode() -> None:
    """The snippet's jsonencode()d Allow on Resource "*" is found, as is the wildcard-only trust."""
    violations = rule_iam_statements([parse("bad.tf", BAD_SNIPPETS["iam_statements"][0])])
    assert any("S3/KMS actions on every resource" in v and "aws_iam_role_policy" in v for v in violations), (
        violations
    )
    assert any("sts.amazonaws.com audience" in v for v in violations), violations


def test_a_replica_policy_including_a_write_statement_is_caught() -> None:
    text = """
locals {
  write = { Effect = "Allow", Action = ["s3:PutObject"], Resource = "${var.bucket_arn}/*" }
  replica_policy = { Version = "2012-10-17", Statement = [local.write] }
}
"""
    violations = rule_iam_statements([parse("bad.tf", text)])
    assert any("replica_policy" in v and "replicas only read" in v for v in violations), violations


GATEWAY_FILES_POLICY = """
locals {
  gateway_batch_files_policy = {
    Statement = [
      {
        Effect = "Allow", Action = "s3:ListBucket", Resource = var.files_bucket_arn
        Condition = { StringLike = { "s3:prefix" = "files/*" } }
      },
      { Effect = "Allow", Action = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"], Resource = RESOURCE },
      {
        Effect = "Allow", Action = ["kms:GenerateDataKey", "kms:Decrypt"], Resource = var.files_kms_key_arn
        Condition = { StringLike = { "kms:ViaService" = "s3.*.amazonaws.com" } }
      },
    ]
  }
}
"""


@pytest.mark.parametrize("resource", ['"${var.weights_bucket_arn}/*"', '"${local.engines_arn}/*"', '"*"'])
def test_a_gateway_writing_anywhere_but_the_files_bucket_is_caught(resource: str) -> None:
    """The gateway's files policy as modules/iam writes it passes; the same policy granting PutObject and
    DeleteObject on the weights bucket (or its engines, or everything) fails."""
    good = parse("iam.tf", GATEWAY_FILES_POLICY.replace("RESOURCE", '"${local.files_objects_arn}"'))
    assert rule_gateway_writes_only_files([good]) == []
    bad = parse("iam.tf", GATEWAY_FILES_POLICY.replace("RESOURCE", resource))
    violations = rule_gateway_writes_only_files([bad])
    assert len(violations) == 1 and "a gateway writes only the files bucket" in violations[0], violations
    assert "s3:PutObject" in violations[0] and "gateway_batch_files_policy" in violations[0], violations


def test_a_gateway_listing_the_whole_files_bucket_is_caught() -> None:
    text = GATEWAY_FILES_POLICY.replace("RESOURCE", '"${local.files_objects_arn}"').replace(
        'Condition = { StringLike = { "s3:prefix" = "files/*" } }', ""
    )
    violations = rule_gateway_writes_only_files([parse("iam.tf", text)])
    assert len(violations) == 1 and "only under its prefix (s3:prefix)" in violations[0], violations


def test_a_files_objects_local_pointing_at_the_weights_bucket_is_caught() -> None:
    text = 'locals {\n  files_objects_arn = "${var.weights_bucket_arn}/files/*"\n}\n'
    violations = rule_gateway_writes_only_files([parse("iam.tf", text)])
    assert len(violations) == 1, violations
    assert violations[0].startswith("iam.tf: locals.files_objects_arn must be under var.files_bucket_arn")
