"""Triton's Python-based ``onnxruntime`` backend of the testbed image (``model.py``).

``model.py`` runs inside tritonserver's Python backend stub (it imports
``triton_python_backend_utils``); it is not imported from here. This package exists so the file
ships with the test tooling: ``tritonfleet_testbed.standin_images.backend_model_py()`` gives its path.
"""
