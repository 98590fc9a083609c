"""The API the tenants write: the four resources' schemas (one source for the CRDs and for Python
validation), the parsed model, per-object and cross-object validation, and the generated CRDs. Pure."""
