"""Using a trained model: the estimators' shared base (``estimator``)."""
