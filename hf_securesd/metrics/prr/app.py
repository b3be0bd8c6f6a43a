import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("securesd/prr")
launch_gradio_widget(module)
