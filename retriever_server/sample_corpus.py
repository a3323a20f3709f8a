"""A small, realistic, deterministic sample corpus: three multi-page PDFs made with reportlab.

Every page carries a few distinctive terms recorded in ``SAMPLE_FACTS`` so tests and demos can
check that a query lands on the right page. Each section ends with an explicit page break, so the
page a term sits on does not depend on text flow. reportlab's invariant mode fixes the creation
date and document id, so the bytes are the same on every run.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from reportlab.graphics.charts.barcharts import VerticalBarChart
from reportlab.graphics.charts.linecharts import HorizontalLineChart
from reportlab.graphics.shapes import Drawing, String
from reportlab.lib import colors
from reportlab.lib.pagesizes import letter
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import inch
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

# query -> (doc_id, 1-based page). The query words appear on that page and nowhere else in the doc.
SAMPLE_FACTS: dict[str, tuple[str, int]] = {
    "board approved the Lisbon expansion": ("annual_report", 1),
    "segment revenue and EBITDA margin": ("annual_report", 2),
    "quarterly shipments by region": ("annual_report", 3),
    "solar panels at the Tilburg plant": ("annual_report", 4),
    "hearing protection and steel-toe boots": ("safety_manual", 1),
    "lockout tagout padlock isolation": ("safety_manual", 2),
    "flammable solvents cabinet": ("safety_manual", 3),
    "evacuation assembly point muster": ("safety_manual", 4),
    "lost-time incidents per year": ("safety_manual", 5),
    "thermostat learns your schedule to save energy": ("product_guide", 1),
    "C-wire wiring terminals": ("product_guide", 2),
    "battery life and Zigbee radio": ("product_guide", 3),
    "error code E42 firmware reset": ("product_guide", 4),
}

SAMPLE_DOC_IDS = ("annual_report", "safety_manual", "product_guide")


@dataclass(frozen=True)
class _Styles:
    title: object
    heading: object
    body: object


def _styles() -> _Styles:
    sheet = getSampleStyleSheet()
    return _Styles(title=sheet["Title"], heading=sheet["Heading2"], body=sheet["BodyText"])


def _table(rows: list[list[str]]) -> Table:
    table = Table(rows, hAlign="LEFT")
    table.setStyle(
        TableStyle(
            [
                ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#dde6f0")),
                ("GRID", (0, 0), (-1, -1), 0.5, colors.grey),
                ("FONTNAME", (0, 0), (-1, 0), "Helvetica-Bold"),
                ("ALIGN", (1, 1), (-1, -1), "RIGHT"),
            ]
        )
    )
    return table


def _bar_chart(title: str, categories: list[str], series: list[list[float]]) -> Drawing:
    drawing = Drawing(6 * inch, 3.2 * inch)
    chart = VerticalBarChart()
    chart.x, chart.y = 50, 40
    chart.width, chart.height = 5 * inch, 2.3 * inch
    chart.data = series
    chart.categoryAxis.categoryNames = categories
    chart.valueAxis.valueMin = 0
    palette = [colors.HexColor("#4472c4"), colors.HexColor("#ed7d31"), colors.HexColor("#70ad47")]
    for i in range(len(series)):
        chart.bars[i].fillColor = palette[i % len(palette)]
    drawing.add(chart)
    drawing.add(String(50, 3 * inch, title, fontName="Helvetica-Bold", fontSize=11))
    return drawing


def _line_chart(title: str, categories: list[str], values: list[float]) -> Drawing:
    drawing = Drawing(6 * inch, 3.2 * inch)
    chart = HorizontalLineChart()
    chart.x, chart.y = 50, 40
    chart.width, chart.height = 5 * inch, 2.3 * inch
    chart.data = [values]
    chart.categoryAxis.categoryNames = categories
    chart.valueAxis.valueMin = 0
    chart.lines[0].strokeColor = colors.HexColor("#c00000")
    chart.lines[0].strokeWidth = 2
    drawing.add(chart)
    drawing.add(String(50, 3 * inch, title, fontName="Helvetica-Bold", fontSize=11))
    return drawing


def _annual_report(s: _Styles) -> list:
    p = lambda text: Paragraph(text, s.body)  # noqa: E731
    return [
        Paragraph("Northwind Logistics Annual Report 2025", s.title),
        Paragraph("Letter from the Chair", s.heading),
        p("Dear shareholders, 2025 was a year of steady growth for Northwind Logistics. Net sales "
          "rose nine percent to 412 million euros while we kept overhead flat."),
        p("In September the board approved the Lisbon expansion: a new cross-dock hub that will "
          "serve customers in Portugal and western Spain from the second half of 2026."),
        p("We thank our 2,300 employees for their commitment and our customers for their trust."),
        PageBreak(),
        Paragraph("Financial Highlights", s.heading),
        p("The table below breaks down segment revenue and EBITDA margin for the fiscal year. "
          "Contract logistics remains the largest segment; freight forwarding improved the most."),
        Spacer(1, 8),
        _table([
            ["Segment", "Revenue (EUR m)", "EBITDA margin", "Change"],
            ["Contract logistics", "187.4", "14.2%", "+6%"],
            ["Freight forwarding", "121.9", "9.8%", "+15%"],
            ["Last-mile delivery", "73.5", "7.1%", "+8%"],
            ["Warehousing services", "29.2", "18.5%", "+3%"],
            ["Total", "412.0", "12.4%", "+9%"],
        ]),
        PageBreak(),
        Paragraph("Operations Review", s.heading),
        p("Quarterly shipments by region are shown in the chart below. The Benelux region handled "
          "the most shipments in every quarter, and the Nordic region grew fastest."),
        Spacer(1, 8),
        _bar_chart(
            "Quarterly shipments by region (thousands)",
            ["Q1", "Q2", "Q3", "Q4"],
            [[120, 135, 128, 150], [80, 86, 91, 99], [40, 52, 61, 70]],
        ),
        p("Legend: blue Benelux, orange Germany, green Nordics."),
        PageBreak(),
        Paragraph("Sustainability", s.heading),
        p("Scope 1 and 2 carbon emissions fell eleven percent. The largest contribution came from "
          "the 4.2 megawatt rooftop solar panels installed at the Tilburg plant in March."),
        p("We converted 140 delivery vans to battery-electric drive trains and plan to reach a "
          "fully electric urban fleet by 2028."),
    ]


def _safety_manual(s: _Styles) -> list:
    p = lambda text: Paragraph(text, s.body)  # noqa: E731
    return [
        Paragraph("Plant Safety Manual, Revision 7", s.title),
        Paragraph("1. Personal Protective Equipment", s.heading),
        p("Everyone on the production floor wears a hard hat, safety glasses, hearing protection "
          "and steel-toe boots. Visitors receive equipment at the gatehouse."),
        p("Replace damaged equipment immediately; report defects to your shift supervisor."),
        PageBreak(),
        Paragraph("2. Lockout/Tagout Procedure", s.heading),
        p("Before maintenance on any powered machine, perform lockout tagout: notify operators, "
          "shut the machine down, isolate every energy source, and apply your personal padlock "
          "and tag to the isolation point."),
        p("Verify zero energy by trying the start button. Only the person who applied a padlock "
          "may remove it."),
        PageBreak(),
        Paragraph("3. Chemical Storage", s.heading),
        p("Store chemicals by hazard class. Flammable solvents go in the yellow fire-rated cabinet; "
          "never store oxidizers beside them."),
        Spacer(1, 8),
        _table([
            ["Chemical", "Hazard class", "Storage location", "Max quantity"],
            ["Acetone", "Flammable liquid", "Yellow cabinet A", "20 L"],
            ["Isopropanol", "Flammable liquid", "Yellow cabinet A", "20 L"],
            ["Sodium hypochlorite", "Corrosive", "Blue cabinet C", "10 L"],
            ["Hydrogen peroxide 30%", "Oxidizer", "White cabinet D", "5 L"],
        ]),
        PageBreak(),
        Paragraph("4. Emergency Evacuation", s.heading),
        p("When the fire alarm sounds, stop work, leave by the nearest marked evacuation route and "
          "walk to the assembly point in the north car park. Floor wardens take the muster "
          "and report missing persons to the fire brigade."),
        p("Do not use elevators. Do not return to the building until the all-clear is given."),
        PageBreak(),
        Paragraph("5. Incident Statistics", s.heading),
        p("The chart shows lost-time incidents per year at the plant. The drop after 2022 follows "
          "the introduction of daily toolbox talks."),
        Spacer(1, 8),
        _line_chart("Lost-time incidents per year", ["2020", "2021", "2022", "2023", "2024"],
                    [14, 12, 11, 6, 4]),
    ]


def _product_guide(s: _Styles) -> list:
    p = lambda text: Paragraph(text, s.body)  # noqa: E731
    return [
        Paragraph("Heliotrope HX-300 Smart Thermostat: User Guide", s.title),
        Paragraph("Overview", s.heading),
        p("The HX-300 thermostat learns your schedule and adjusts heating and cooling to save "
          "energy. This guide covers installation, specifications and troubleshooting."),
        p("In the box: thermostat unit, trim plate, screws and anchors, quick start card."),
        PageBreak(),
        Paragraph("Installation", s.heading),
        p("Turn off power at the breaker. Remove the old unit and label each wire. Mount the wall "
          "bracket, then connect the wires to the wiring terminals: R, W, Y, G and the C-wire for "
          "continuous power."),
        p("If your system has no C-wire, use the included power adapter kit."),
        PageBreak(),
        Paragraph("Specifications", s.heading),
        _table([
            ["Property", "Value"],
            ["Display", "3.5 inch colour touchscreen"],
            ["Radios", "Wi-Fi 2.4 GHz, Zigbee 3.0"],
            ["Battery life (backup)", "up to 18 months"],
            ["Operating range", "5 to 35 degrees Celsius"],
            ["Dimensions", "92 x 92 x 24 mm"],
        ]),
        Spacer(1, 8),
        p("The Zigbee radio pairs with room sensors; the backup battery life keeps the schedule "
          "during power cuts."),
        PageBreak(),
        Paragraph("Troubleshooting", s.heading),
        p("Error code E42 means the firmware update failed. Hold the dial for ten seconds to "
          "start a firmware reset, then reconnect to Wi-Fi."),
        p("If the display stays blank, check the breaker and the C-wire connection."),
    ]


_BUILDERS = {
    "annual_report": (_annual_report, "Northwind Logistics Annual Report 2025"),
    "safety_manual": (_safety_manual, "Plant Safety Manual"),
    "product_guide": (_product_guide, "Heliotrope HX-300 User Guide"),
}


def _footer(title: str):
    def draw(canvas, doc) -> None:
        canvas.saveState()
        canvas.setFont("Helvetica", 8)
        canvas.drawString(inch, 0.6 * inch, title)
        canvas.drawRightString(letter[0] - inch, 0.6 * inch, f"Page {doc.page}")
        canvas.restoreState()

    return draw


def write_sample_corpus(out_dir) -> list[pathlib.Path]:
    """Write the three sample PDFs into ``out_dir`` and return their paths (doc id = file stem)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    styles = _styles()
    paths = []
    for doc_id in SAMPLE_DOC_IDS:
        build, title = _BUILDERS[doc_id]
        path = out / f"{doc_id}.pdf"
        # invariant=1 pins timestamps and the file id, so the bytes are reproducible.
        doc = SimpleDocTemplate(str(path), pagesize=letter, invariant=1, title=title,
                                author="vrag-rollout sample corpus")
        footer = _footer(title)
        doc.build(build(styles), onFirstPage=footer, onLaterPages=footer)
        paths.append(path)
    return paths
