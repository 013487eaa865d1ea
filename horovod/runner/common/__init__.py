"""Where Horovod keeps the runner's shared helpers; scripts and Horovod's tests import from here."""
