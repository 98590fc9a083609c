"""The lean controller: validate, allocate, render the gateway plan; own the pod and cloud objects."""
