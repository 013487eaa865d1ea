"""What the Spark estimators share: the store, the parameters, the data path and the base classes."""
