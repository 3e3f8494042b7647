"""The security rules of deploy/terraform on the parsed HCL (python-hcl2) of its .tf files: encryption at
rest and in transit, no public access, the GPU taint, least-privilege IAM. Each rule is a function from
parsed files to violations, "<file>: <type>.<name>: <what is wrong>". Checked by test_terraform_rules.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hcl2
from hcl2.utils import SerializationOptions

ROOT = Path(__file__).resolve().parents[2]
TF_DIR = ROOT / "deploy" / "terraform"
OPTIONS = SerializationOptions(
    with_comments=False, explicit_blocks=False, strip_string_quotes=True, preserve_heredocs=False
)
S3_WRITE = re.compile(r"^s3:(Put|Delete|Abort|Restore|Replicate)", re.IGNORECASE)
GPU_HINT = re.compile(r"gpu|nvidia", re.IGNORECASE)


@dataclass(frozen=True)
class TfFile:
    path: str  # relative to the repository root: what a violation names
    body: dict[str, Any]

    @property
    def module_dir(self) -> str:
        return str(Path(self.path).parent)


@dataclass(frozen=True)
class Statement:
    """One IAM policy statement: from a JSON-shaped object (Effect, Action...) or a policy document."""

    origin: str
    effect: str
    actions: list[str]
    not_actions: list[str]
    resources: list[str]
    conditions: dict[str, dict[str, list[str]]]  # test -> variable -> values


Rule = Callable[[list[TfFile]], list[str]]


def parse(path: str, text: str) -> TfFile:
    return TfFile(path, hcl2.loads(text, serialization_options=OPTIONS))


def load_tree() -> list[TfFile]:
    files = sorted(p for p in TF_DIR.rglob("*.tf") if ".terraform" not in p.parts)
    return [parse(str(p.relative_to(ROOT)), p.read_text()) for p in files]


def blocks(files: list[TfFile], kind: str, type_: str) -> Iterator[tuple[TfFile, str, dict[str, Any]]]:
    """Every `<kind> "<type_>" "<name>"` block (kind: resource or data) as (file, name, body)."""
    for f in files:
        for entry in f.body.get(kind, []):
            for name, body in entry.get(type_, {}).items():
                yield f, name, body


def modules(files: list[TfFile]) -> Iterator[tuple[TfFile, str, dict[str, Any]]]:
    for f in files:
        for entry in f.body.get("module", []):
            for name, body in entry.items():
                yield f, name, body


def where(f: TfFile, type_: str, name: str) -> str:
    return f"{f.path}: {type_}.{name}"


def first(body: dict[str, Any], key: str) -> dict[str, Any]:
    """The first nested block `key` of a block body, or {} when it is absent."""
    value = body.get(key) or [{}]
    return value[0] if isinstance(value, list) else value


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def mentions(value: Any, text: str) -> bool:
    return text in str(value)


# --- encryption and public access ---------------------------------------------------------------------


def attached(files: list[TfFile], type_: str, bucket: str) -> list[dict[str, Any]]:
    """The `type_` resources of these files whose `bucket` refers to aws_s3_bucket.<bucket>."""
    ref = f"aws_s3_bucket.{bucket}."
    return [b for _, _, b in blocks(files, "resource", type_) if mentions(b.get("bucket"), ref)]


def rule_s3_buckets(files: list[TfFile]) -> list[str]:
    """Every bucket: public access block all true, SSE-KMS with a key, versioning, TLS-only policy."""
    out = []
    for f, name, _ in blocks(files, "resource", "aws_s3_bucket"):
        at = where(f, "aws_s3_bucket", name)
        same_module = [g for g in files if g.module_dir == f.module_dir]
        pab = attached(same_module, "aws_s3_bucket_public_access_block", name)
        flags = ["block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"]
        if not pab or not all(b.get(k) is True for b in pab for k in flags):
            out.append(f"{at}: needs a public access block with all four settings true")
        sse = [
            first(first(b, "rule"), "apply_server_side_encryption_by_default")
            for b in attached(same_module, "aws_s3_bucket_server_side_encryption_configuration", name)
        ]
        if not sse or not all(
            s.get("sse_algorithm") == "aws:kms" and s.get("kms_master_key_id") for s in sse
        ):
            out.append(f"{at}: needs SSE-KMS with a customer key")
        versioning = attached(same_module, "aws_s3_bucket_versioning", name)
        if not versioning or first(versioning[0], "versioning_configuration").get("status") != "Enabled":
            out.append(f"{at}: needs versioning Enabled")
        denies_plain_http = any(
            s.effect == "Deny" and s.conditions.get("Bool", {}).get("aws:SecureTransport") == ["false"]
            for s in statements(same_module)
        )
        if not attached(same_module, "aws_s3_bucket_policy", name) or not denies_plain_http:
            out.append(f"{at}: needs a bucket policy denying aws:SecureTransport=false")
    return out


def rule_redis(files: list[TfFile]) -> list[str]:
    out = []
    for f, name, b in blocks(files, "resource", "aws_elasticache_replication_group"):
        at = where(f, "aws_elasticache_replication_group", name)
        if b.get("at_rest_encryption_enabled") not in (True, "true") or not b.get("kms_key_id"):
            out.append(f"{at}: needs at_rest_encryption_enabled = true with a kms_key_id")
        if b.get("transit_encryption_enabled") is not True:
            out.append(f"{at}: needs transit_encryption_enabled = true")
        if not b.get("auth_token"):
            out.append(f"{at}: needs an auth_token")
    return out


def rule_postgres(files: list[TfFile]) -> list[str]:
    """Encrypted with a key, not public, password managed by RDS, TLS forced by its parameter group."""
    out = []
    force_ssl_groups = {
        name
        for _, name, b in blocks(files, "resource", "aws_db_parameter_group")
        if any(
            p.get("name") == "rds.force_ssl" and str(p.get("value")) == "1" for p in b.get("parameter", [])
        )
    }
    for f, name, b in blocks(files, "resource", "aws_db_instance"):
        at = where(f, "aws_db_instance", name)
        if b.get("storage_encrypted") is not True or not b.get("kms_key_id"):
            out.append(f"{at}: needs storage_encrypted = true with a kms_key_id")
        if b.get("publicly_accessible") is not False:
            out.append(f"{at}: needs publicly_accessible = false")
        if b.get("manage_master_user_password") is not True or "password" in b:
            out.append(f"{at}: needs manage_master_user_password = true and no password")
        if b.get("performance_insights_enabled") and not b.get("performance_insights_kms_key_id"):
            out.append(f"{at}: Performance Insights needs performance_insights_kms_key_id")
        group = re.fullmatch(
            r"\$\{aws_db_parameter_group\.(\w+)\.(name|id)\}", str(b.get("parameter_group_name"))
        )
        if not group or group.group(1) not in force_ssl_groups:
            out.append(f"{at}: needs a parameter group of this tree with rds.force_ssl = 1")
    return out


def rule_eks(files: list[TfFile]) -> list[str]:
    """Secrets envelope-encrypted, encrypted node disks with IMDSv2, node groups off public subnets."""
    out = []
    for f, name, b in blocks(files, "resource", "aws_eks_cluster"):
        enc = first(b, "encryption_config")
        if "secrets" not in as_list(enc.get("resources")) or not first(enc, "provider").get("key_arn"):
            out.append(
                f"{where(f, 'aws_eks_cluster', name)}: needs encryption_config for secrets with a KMS key"
            )
    for f, name, b in blocks(files, "resource", "aws_launch_template"):
        for mapping in b.get("block_device_mappings", []):
            if first(mapping, "ebs").get("encrypted") is not True:
                out.append(f"{where(f, 'aws_launch_template', name)}: EBS volumes need encrypted = true")
        if first(b, "metadata_options").get("http_tokens") != "required":
            out.append(f"{where(f, 'aws_launch_template', name)}: needs IMDSv2 (http_tokens = required)")
    for f, name, b in blocks(files, "resource", "aws_eks_node_group"):
        if mentions(b.get("subnet_ids"), "public"):
            out.append(f"{where(f, 'aws_eks_node_group', name)}: nodes must not be in public subnets")
    return out


def rule_private_wiring(files: list[TfFile]) -> list[str]:
    """Environments hand eks, redis and postgres the network's private subnets, never public ones."""
    out = []
    for f, name, b in modules(files):
        if re.search(r"modules/(eks|redis|postgres)/?$", str(b.get("source", ""))):
            subnets = str(b.get("subnet_ids"))
            if "private_subnet_ids" not in subnets or "public" in subnets:
                out.append(f"{f.path}: module.{name}: subnet_ids must be the private subnets, got {subnets}")
    return out


def rule_no_open_ingress(files: list[TfFile]) -> list[str]:
    open_cidrs = {"0.0.0.0/0", "::/0"}
    out = []
    for f, name, b in blocks(files, "resource", "aws_vpc_security_group_ingress_rule"):
        if {b.get("cidr_ipv4"), b.get("cidr_ipv6")} & open_cidrs:
            out.append(
                f"{where(f, 'aws_vpc_security_group_ingress_rule', name)}: ingress open to the internet"
            )
    for f, name, b in blocks(files, "resource", "aws_security_group"):
        for rule in b.get("ingress", []):
            if set(as_list(rule.get("cidr_blocks")) + as_list(rule.get("ipv6_cidr_blocks"))) & open_cidrs:
                out.append(f"{where(f, 'aws_security_group', name)}: ingress open to the internet")
    return out


def rule_kms_rotation(files: list[TfFile]) -> list[str]:
    return [
        f"{where(f, 'aws_kms_key', name)}: needs enable_key_rotation = true"
        for f, name, b in blocks(files, "resource", "aws_kms_key")
        if b.get("enable_key_rotation") is not True
    ]


def rule_gpu_taint(files: list[TfFile]) -> list[str]:
    """GPU node groups carry nvidia.com/gpu NoSchedule, so only replicas (which tolerate it) land there."""
    out = []
    for f, name, b in blocks(files, "resource", "aws_eks_node_group"):
        described = " ".join(str(b.get(k)) for k in ("ami_type", "instance_types", "node_group_name")) + name
        if not GPU_HINT.search(described):
            continue
        taints = b.get("taint", [])
        if not any(t.get("key") == "nvidia.com/gpu" and t.get("effect") == "NO_SCHEDULE" for t in taints):
            out.append(
                f"{where(f, 'aws_eks_node_group', name)}: GPU nodes need the nvidia.com/gpu NO_SCHEDULE taint"
            )
    return out


# --- IAM -----------------------------------------------------------------------------------------------


def object_literals(expression: str) -> Iterator[dict[str, Any]]:
    """HCL object literals inside an expression string (jsonencode({...}), for-expressions), parsed."""
    i = 0
    while (start := expression.find("{", i)) != -1:
        i = start + 1
        if expression[start - 1 : start] == "$" or expression[start + 1 :].lstrip().startswith("for "):
            continue
        depth = 0
        for end in range(start, len(expression)):
            depth += {"{": 1, "}": -1}.get(expression[end], 0)
            if depth == 0:
                break
        try:
            parsed = hcl2.loads("x = " + expression[start : end + 1], serialization_options=OPTIONS)["x"]
        except Exception:  # not an object literal (a template, a for body): look inside
            continue
        if isinstance(parsed, dict):
            yield parsed
            i = end + 1


LOCAL_REF = re.compile(r"^\$\{local\.(\w+)\}$")


def json_statements(node: Any, origin: str, locals_: dict[str, Any]) -> Iterator[Statement]:
    """Statements in a parsed value; a bare `local.X` in a list is followed, so a policy's origin names
    the statements it includes by reference (a replica policy including a write statement is caught)."""
    if isinstance(node, str):
        ref = LOCAL_REF.match(node)
        if ref and isinstance(locals_.get(ref.group(1)), dict) and origin.endswith("]"):
            yield from json_statements(locals_[ref.group(1)], f"{origin}=local.{ref.group(1)}", locals_)
            return
        for i, obj in enumerate(object_literals(node)):
            yield from json_statements(obj, f"{origin}{{{i}}}", locals_)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from json_statements(item, f"{origin}[{i}]", locals_)
    elif isinstance(node, dict):
        if "Effect" in node:
            conditions = node.get("Condition") or {}
            yield Statement(
                origin=origin,
                effect=str(node["Effect"]),
                actions=as_list(node.get("Action")),
                not_actions=as_list(node.get("NotAction")),
                resources=as_list(node.get("Resource")),
                conditions={t: {k: as_list(v) for k, v in c.items()} for t, c in conditions.items()},
            )
        for key, value in node.items():
            if key != "Condition":
                yield from json_statements(value, f"{origin}.{key}", locals_)


def statements(files: list[TfFile]) -> Iterator[Statement]:
    """Every policy statement: JSON-shaped objects anywhere, and aws_iam_policy_document blocks."""
    for f in files:
        locals_ = {k: v for entry in f.body.get("locals", []) for k, v in entry.items()}
        yield from json_statements({k: v for k, v in f.body.items() if k != "data"}, f.path, locals_)
        for entry in f.body.get("data", []):
            for type_, named in entry.items():
                if type_ != "aws_iam_policy_document":
                    yield from json_statements(named, f"{f.path}: data.{type_}", locals_)
                    continue
                for name, doc in named.items():
                    for i, s in enumerate(doc.get("statement", [])):
                        conditions: dict[str, dict[str, list[str]]] = {}
                        for c in s.get("condition", []):
                            conditions.setdefault(c["test"], {})[c["variable"]] = as_list(c.get("values"))
                        yield Statement(
                            origin=f"{f.path}: data.aws_iam_policy_document.{name}.statement[{i}]",
                            effect=s.get("effect", "Allow"),
                            actions=as_list(s.get("actions")),
                            not_actions=as_list(s.get("not_actions")),
                            resources=as_list(s.get("resources")),
                            conditions=conditions,
                        )


def rule_iam_statements(files: list[TfFile]) -> list[str]:
    """No wildcard action; no "*" resource for S3 or KMS; IRSA trust pinned to one service account and STS."""
    out = []
    for s in statements(files):
        if s.effect != "Allow":
            continue
        if s.not_actions or any(a == "*" or a.endswith(":*") for a in s.actions):
            out.append(
                f"{s.origin}: wildcard or NotAction in an Allow statement: {s.actions or s.not_actions}"
            )
        if any(a.startswith(("s3:", "kms:")) for a in s.actions) and any(
            r in ("*", "arn:aws:s3:::*") for r in s.resources
        ):
            out.append(f"{s.origin}: S3/KMS actions on every resource: {s.resources}")
        if "sts:AssumeRoleWithWebIdentity" in s.actions:
            exact = s.conditions.get("StringEquals", {})
            subs = [v for k, vs in exact.items() if k.endswith(":sub") for v in vs]
            auds = [v for k, vs in exact.items() if k.endswith(":aud") for v in vs]
            if len(subs) != 1 or not subs[0].startswith("system:serviceaccount:") or "*" in subs[0]:
                out.append(
                    f"{s.origin}: web-identity trust must name exactly one service account (StringEquals)"
                )
            if auds != ["sts.amazonaws.com"]:
                out.append(f"{s.origin}: web-identity trust must require the sts.amazonaws.com audience")
        if "replica" in s.origin and any(S3_WRITE.match(a) for a in s.actions):
            out.append(f"{s.origin}: replicas only read artifacts, got {s.actions}")
    return out


# What a gateway may read of an artifact: its manifest and tokenizer files (sluice/artifacts.py), no weights.
GATEWAY_FILES = frozenset(
    {"manifest.json", "tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
     "special_tokens_map.json"}
)  # fmt: skip


POLICY_ROLES = ("replica", "build", "gateway", "0", "count.index")  # the role keys a policy may name


def rule_iam_attachments(files: list[TfFile]) -> list[str]:
    """Only the replica, build and gateway roles get policies (the gateway's checked by
    ``rule_gateway_reads_tokenizers_only`` and ``rule_gateway_writes_only_files``); the control plane none;
    no *FullAccess."""
    out = []
    for type_ in ("aws_iam_role_policy", "aws_iam_role_policy_attachment", "aws_iam_policy_attachment"):
        for f, name, b in blocks(files, "resource", type_):
            role = str(b.get("role", "")) + str(b.get("roles", ""))
            if re.search(r"control.?plane", role):
                out.append(f"{where(f, type_, name)}: the control plane gets no policy ({role})")
            if re.search(r"gateway", role) and type_ != "aws_iam_role_policy":
                out.append(f"{where(f, type_, name)}: the gateway gets only its inline policies")
            indexed = re.search(r"aws_iam_role\.\w+\[([^\]]*)\]", role)
            if indexed and indexed.group(1).strip('"') not in POLICY_ROLES:
                out.append(f"{where(f, type_, name)}: a policy for an unnamed service account role ({role})")
            if re.search(r"(FullAccess|AdministratorAccess|PowerUserAccess)$", str(b.get("policy_arn", ""))):
                out.append(f"{where(f, type_, name)}: broad managed policy {b.get('policy_arn')}")
    return out


# What a gateway's statements may grant at all: tokenizer reads from the weights bucket, and its file store
# (sluice/stores/files/s3.py: one PUT per object, GET, DELETE, LIST) in the files bucket with that bucket's
# key.
GATEWAY_ACTIONS = frozenset(
    {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "kms:Decrypt", "kms:GenerateDataKey"}
)
# A resource of the files bucket or its key, as modules/iam names them (var.files_bucket_arn,
# var.files_kms_key_arn, local.files_objects_arn); modules/iam/tests checks the ARNs they become.
FILES_RESOURCE = re.compile(r"\b(var\.files_bucket_arn|var\.files_kms_key_arn|local\.files_objects_arn)\b")


def gateway_statements(files: list[TfFile]) -> Iterator[Statement]:
    return (s for s in statements(files) if "gateway" in s.origin and s.effect == "Allow")


def rule_gateway_reads_tokenizers_only(files: list[TfFile]) -> list[str]:
    """Outside the files bucket, a gateway's statements: s3:GetObject on manifest and tokenizer files only
    (``GATEWAY_FILES``, listed in a ``gateway_files`` local); kms:Decrypt only through S3 (kms:ViaService);
    and no action beyond ``GATEWAY_ACTIONS`` anywhere."""
    out = []
    for s in gateway_statements(files):
        if not set(s.actions) <= GATEWAY_ACTIONS:
            out.append(f"{s.origin}: a gateway may only use {sorted(GATEWAY_ACTIONS)}, got {s.actions}")
        if any(a.startswith("kms:") for a in s.actions) and not any(
            "kms:ViaService" in c for c in s.conditions.values()
        ):
            out.append(f"{s.origin}: a gateway uses KMS keys only through S3 (kms:ViaService)")
        if "s3:GetObject" in s.actions:
            for resource in s.resources:
                if FILES_RESOURCE.search(resource):
                    continue
                named = re.search(r"/([\w.]+)\"?\]?\}?$", resource)
                through_list = "local.gateway_files" in resource
                if not through_list and (named is None or named.group(1) not in GATEWAY_FILES):
                    out.append(f"{s.origin}: a gateway reads only manifests and tokenizers, got {resource}")
    for f in files:
        for local_block in f.body.get("locals", []):
            listed = local_block.get("gateway_files")
            if listed is not None and not set(listed) <= GATEWAY_FILES:
                out.append(f"{f.path}: locals.gateway_files may list only {sorted(GATEWAY_FILES)}: {listed}")
    return out


def rule_gateway_writes_only_files(files: list[TfFile]) -> list[str]:
    """A gateway writes, deletes, lists and encrypts ONLY in the files bucket (never the weights bucket):
    every resource of such a statement is the files bucket, its objects or its key, and a list is scoped to
    the prefix by an s3:prefix condition."""
    out = []
    for s in gateway_statements(files):
        writes = [a for a in s.actions if S3_WRITE.match(a) or a in ("s3:ListBucket", "kms:GenerateDataKey")]
        if not writes:
            continue
        for resource in s.resources or ["(no resource)"]:
            if not FILES_RESOURCE.search(resource):
                out.append(f"{s.origin}: a gateway writes only the files bucket, got {writes} on {resource}")
        if "s3:ListBucket" in s.actions and not any("s3:prefix" in c for c in s.conditions.values()):
            out.append(f"{s.origin}: a gateway lists the files bucket only under its prefix (s3:prefix)")
    for f in files:  # the local the rule trusts by name must be what its name says
        for local_block in f.body.get("locals", []):
            objects = local_block.get("files_objects_arn")
            if objects is not None and not str(objects).startswith("${var.files_bucket_arn}/"):
                out.append(
                    f"{f.path}: locals.files_objects_arn must be under var.files_bucket_arn: {objects}"
                )
    return out


RULES: dict[str, Rule] = {
    "s3_buckets": rule_s3_buckets,
    "redis": rule_redis,
    "postgres": rule_postgres,
    "eks": rule_eks,
    "private_wiring": rule_private_wiring,
    "no_open_ingress": rule_no_open_ingress,
    "kms_rotation": rule_kms_rotation,
    "gpu_taint": rule_gpu_taint,
    "iam_statements": rule_iam_statements,
    "iam_attachments": rule_iam_attachments,
    "gateway_reads_tokenizers_only": rule_gateway_reads_tokenizers_only,
    "gateway_writes_only_files": rule_gateway_writes_only_files,
}
