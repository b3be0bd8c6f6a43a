import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("securesd/flips")
launch_gradio_widget(module)
