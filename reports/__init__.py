"""Reports: Panel pages built from the warehouse views, saved as one offline HTML file
or served live. Knows nothing about how the data was produced.
"""
