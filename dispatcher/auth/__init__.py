"""API keys: their format and scopes (pure), and the keyring that resolves them."""
