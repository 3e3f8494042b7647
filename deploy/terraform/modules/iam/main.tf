# IAM roles for service accounts (IRSA), least privilege:
# - replica:        read the weights bucket, decrypt with its key;
# - build:          read the bucket, write only under engines/, encrypt with the key;
# - gateway:        read ONLY each artifact's manifest and tokenizer files (what sluice.artifacts fetches for
#                   a gateway: TOKENIZER_FILES), decrypting through S3 only; never the weights or engines;
#                   and read, write, delete and list the Files and Batch APIs' objects under the files
#                   bucket's prefix (SLUICE_FILES_URL), with that bucket's key only: the one bucket it writes;
# - control_plane:  an identity with no S3 or KMS access at all.
# Each role trusts exactly one namespace/service account through the cluster's OIDC provider, for the
# STS audience: a token minted for any other service account, or for another audience, cannot assume it.

# NOTE: the documents are jsonencode()d here rather than aws_iam_policy_document data sources, so that
# the plan tests (tests/iam.tftest.hcl, mocked provider) read the exact JSON each role gets.

locals {
  oidc_issuer = trimprefix(var.oidc_provider_url, "https://")
  engines_arn = "${var.weights_bucket_arn}/${var.engines_prefix}*"
  # Every key a gateway's file store uses: <prefix>/files/<tenant>/..., <prefix>/batches/<tenant>/...
  files_objects_arn = "${var.files_bucket_arn}/${var.files_prefix}*"

  trust_policies = {
    for key, sa in var.service_accounts : key => {
      Version = "2012-10-17"
      Statement = [{
        Effect    = "Allow"
        Action    = "sts:AssumeRoleWithWebIdentity"
        Principal = { Federated = var.oidc_provider_arn }
        Condition = {
          StringEquals = {
            "${local.oidc_issuer}:sub" = "system:serviceaccount:${var.namespace}:${sa}"
            "${local.oidc_issuer}:aud" = "sts.amazonaws.com"
          }
        }
      }]
    }
  }

  list_bucket = {
    Sid      = "ListWeights"
    Effect   = "Allow"
    Action   = "s3:ListBucket"
    Resource = var.weights_bucket_arn
  }
  read_objects = {
    Sid      = "ReadWeightsAndEngines"
    Effect   = "Allow"
    Action   = "s3:GetObject"
    Resource = "${var.weights_bucket_arn}/*"
  }

  # What a gateway reads of an artifact (sluice/artifacts.py TOKENIZER_FILES, and the manifest): each
  # version's tokenizer, to count and bill tokens. NOTE: "*" in an S3 ARN spans "/", so these match
  # engines/<model>/<version>/<file>; an engine's own config.json (engine/config.json) is metadata too.
  gateway_files = [
    "manifest.json", "tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
    "special_tokens_map.json",
  ]
  gateway_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "ReadTokenizers"
        Effect   = "Allow"
        Action   = "s3:GetObject"
        Resource = [for file in local.gateway_files : "${local.engines_arn}/${file}"]
      },
      {
        Sid       = "DecryptTokenizersThroughS3"
        Effect    = "Allow"
        Action    = "kms:Decrypt"
        Resource  = var.weights_kms_key_arn
        Condition = { StringLike = { "kms:ViaService" = "s3.*.amazonaws.com" } }
      },
    ]
  }

  # The Files and Batch APIs' store (sluice/files/s3.py): one PUT per object (no multipart upload), GET,
  # DELETE, and LIST under the prefix (file ids and batch parts); the key encrypts new objects
  # (GenerateDataKey) and decrypts them, through S3 only.
  gateway_batch_files_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "ListFiles"
        Effect    = "Allow"
        Action    = "s3:ListBucket"
        Resource  = var.files_bucket_arn
        Condition = { StringLike = { "s3:prefix" = "${var.files_prefix}*" } }
      },
      {
        Sid      = "ReadWriteFiles"
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
        Resource = local.files_objects_arn
      },
      {
        Sid       = "EncryptFilesThroughS3"
        Effect    = "Allow"
        Action    = ["kms:GenerateDataKey", "kms:Decrypt"]
        Resource  = var.files_kms_key_arn
        Condition = { StringLike = { "kms:ViaService" = "s3.*.amazonaws.com" } }
      },
    ]
  }

  replica_policy = {
    Version = "2012-10-17"
    Statement = [
      local.list_bucket,
      local.read_objects,
      { Sid = "DecryptWeights", Effect = "Allow", Action = "kms:Decrypt", Resource = var.weights_kms_key_arn },
    ]
  }

  build_policy = {
    Version = "2012-10-17"
    Statement = [
      local.list_bucket,
      local.read_objects,
      {
        Sid      = "WriteEngines"
        Effect   = "Allow"
        Action   = ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
        Resource = local.engines_arn
      },
      # NOTE: a multipart upload to an SSE-KMS bucket needs Decrypt as well as GenerateDataKey.
      {
        Sid      = "EncryptEngines"
        Effect   = "Allow"
        Action   = ["kms:GenerateDataKey", "kms:Encrypt", "kms:Decrypt"]
        Resource = var.weights_kms_key_arn
      },
    ]
  }
}

resource "aws_iam_role" "this" {
  for_each = var.service_accounts

  name                 = "${var.name}-${replace(each.key, "_", "-")}"
  description          = "IRSA role of ${var.namespace}/${each.value}"
  assume_role_policy   = jsonencode(local.trust_policies[each.key])
  max_session_duration = 3600
  tags                 = merge(var.tags, { "sluice.io/service-account" = "${var.namespace}.${each.value}" })
}

resource "aws_iam_role_policy" "replica" {
  name   = "read-weights"
  role   = aws_iam_role.this["replica"].id
  policy = jsonencode(local.replica_policy)
}

resource "aws_iam_role_policy" "gateway" {
  name   = "read-tokenizers"
  role   = aws_iam_role.this["gateway"].id
  policy = jsonencode(local.gateway_policy)
}

resource "aws_iam_role_policy" "gateway_files" {
  name   = "read-write-files"
  role   = aws_iam_role.this["gateway"].id
  policy = jsonencode(local.gateway_batch_files_policy)
}

resource "aws_iam_role_policy" "build" {
  name   = "write-engines"
  role   = aws_iam_role.this["build"].id
  policy = jsonencode(local.build_policy)
}
