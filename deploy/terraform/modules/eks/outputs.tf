output "cluster_name" {
  description = "Name of the EKS cluster."
  value       = aws_eks_cluster.this.name
}

output "cluster_endpoint" {
  description = "URL of the Kubernetes API server."
  value       = aws_eks_cluster.this.endpoint
}

output "cluster_certificate_authority_data" {
  description = "Base64 CA certificate of the API server (for kubeconfig)."
  value       = aws_eks_cluster.this.certificate_authority[0].data
}

output "cluster_security_group_id" {
  description = "Security group EKS created for the control plane and managed nodes."
  value       = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
}

output "node_security_group_id" {
  description = "Security group on every node (pods use their node's groups): allow it into Redis and PostgreSQL."
  value       = aws_security_group.node.id
}

output "oidc_provider_arn" {
  description = "ARN of the IAM OIDC provider for IRSA."
  value       = aws_iam_openid_connect_provider.this.arn
}

output "oidc_provider_url" {
  description = "Issuer of the cluster's service-account tokens, without https:// (the prefix of IAM condition keys)."
  value       = trimprefix(aws_eks_cluster.this.identity[0].oidc[0].issuer, "https://")
}

output "secrets_kms_key_arn" {
  description = "KMS key that envelope-encrypts Kubernetes secrets."
  value       = aws_kms_key.secrets.arn
}

output "gpu_node_group_name" {
  description = "Name of the GPU (replica) node group."
  value       = aws_eks_node_group.gpu.node_group_name
}

output "cpu_node_group_name" {
  description = "Name of the CPU (gateway, control plane) node group."
  value       = aws_eks_node_group.cpu.node_group_name
}
