"""OpenAI's Files API: POST/GET /v1/files, GET/DELETE /v1/files/{file_id}, GET /v1/files/{file_id}/content."""
