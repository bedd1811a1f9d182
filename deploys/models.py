# Only Triton: image, model repository, unit, health gate. Never touches drivers.
from tritonfleet.preflight import check_model_repository
from tritonfleet.steps.triton import health_gate, model_repository, triton_image, triton_service

check_model_repository()
image = triton_image()
models = model_repository()
triton_service(image, models)
health_gate()
