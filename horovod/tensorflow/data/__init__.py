"""Horovod's tf.data service helpers: a compute job serves batches to the training job
(`compute_service`, `compute_worker`)."""
