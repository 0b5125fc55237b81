"""Every SQL statement the service runs, as named constants, one module per family (the store
module of the same name runs them). Only ``store`` runs them."""
