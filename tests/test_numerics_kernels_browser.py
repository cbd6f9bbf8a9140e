"""The ``kernels`` panel of ``--per-kernel`` in the report (headless Chromium): a drawer table whose
rows say which kernel is the cause (own error) and which are beyond tolerance only by inheritance,
readable without scrolling sideways, each row selecting its kernel's module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fxviz import examples
from fxviz.analyze.numerics.error import Error
from fxviz.analyze.numerics.kernelresult import BufferCheck, KernelCheck, kernel_panel
from fxviz.api import capture
from tests.report_browser import ReportPage, page_from_data
from tests.test_analysis_browser import FITS

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("bundle")]


def _kernel(handle: str, module: str, error: float, own: float) -> KernelCheck:
    def e(x: float) -> Error:
        return Error(max_abs=x, max_rel=x, rel_rms=x, snr_db=40.0, exceeds=x > 1e-3)

    return KernelCheck(handle, 0, "cpp", module=module, source="examples.py:12", observed=True,
                       buffers=[BufferCheck("buf0", "n", "n", e(error), e(own))])


def test_the_kernels_table_tells_the_cause_from_the_inherited(browser: Any, tmp_path: Path) -> None:
    g = capture(*examples.cnn())
    modules = [m for m in g.modules if m][:3]
    kernels = [_kernel("cpp_fused_convolution_relu_0:1", modules[0], 1e-7, 1e-7),
               _kernel("cpp_fused_add_native_layer_norm_unsqueeze_view_1:2", modules[1], 0.01, 0.01),
               _kernel("extern_kernels.addmm:3", modules[2], 0.04, 0.0)]
    kernel_panel(g, kernels)
    page = ReportPage(browser, page_from_data(g, tmp_path / "kernels.html"), width=1600, height=1000)
    try:
        page.page.locator("[data-ref=drawerBar] .fx-drawer-tab[data-panel=kernels]").click()
        table = page.page.locator("[data-ref=findings] [data-panel=kernels]")
        rows = table.locator("tbody tr").evaluate_all("rows => rows.map(r => [...r.cells].map(c => c.textContent))")
        assert [r[0] for r in rows] == [k.handle for k in kernels]
        assert [r[4] for r in rows] == ["within", "own", "inherited"]
        assert [r[3] for r in rows] == ["1e-07", "0.01", "0"]
        fit = page.page.evaluate(FITS)
        assert fit["outside"] == [] and all(sw <= cw for sw, cw in [fit["body"], *fit["tables"]]), fit
        # a row selects its kernel's module
        table.locator("tbody tr").nth(1).click()
        page.settle()
        assert modules[1] in page.page.locator("[data-ref=details]").text_content()
    finally:
        page.close()
