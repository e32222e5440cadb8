"""bertjax.training.reports: the run's one writer of metrics, TensorBoard and curves."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tensorboard_is_imported_without_torch_and_torch_still_imports_after():
  """tensorboardX imports torch when it can (a second, and a thread importing it raced the run's
  own imports); bertjax's writer takes it without, and leaves torch importable."""
  code = ("import sys\n"
          "from bertjax.training import reports\n"
          "writer = reports.summary_writer_class()\n"
          "assert writer.__name__ == 'SummaryWriter' and 'torch' not in sys.modules\n"
          "import torch\n"
          "assert torch.tensor([1.0]).sum().item() == 1.0\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
