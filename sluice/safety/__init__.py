"""Safety filters: pluggable classifiers (built-in rules, a Triton-served model), named per-tenant
policies, and the streaming screen that holds back output until it has been checked."""
