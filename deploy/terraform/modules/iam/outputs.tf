output "role_arns" {
  description = "Role ARN per service-account key (replica, build, gateway, control_plane): the eks.amazonaws.com/role-arn annotation of each ServiceAccount."
  value       = { for key, role in aws_iam_role.this : key => role.arn }
}

output "role_names" {
  description = "Role name per service-account key."
  value       = { for key, role in aws_iam_role.this : key => role.name }
}

output "service_account_subjects" {
  description = "The token subject each role trusts, per key (system:serviceaccount:NAMESPACE:NAME)."
  value       = { for key, sa in var.service_accounts : key => "system:serviceaccount:${var.namespace}:${sa}" }
}
